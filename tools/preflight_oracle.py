"""vLLM 0.26's own config and KV-cache code as the oracle for reconcile's memory engine (issue 14, a).

On the GPU lab machine (vLLM importable, no network), for every corpus config in
tests/data/model_configs: vLLM's derived max_model_len, its per-layer KV-cache specs (the model built
on the meta device, no weights), its KV cache groups, the memory one request needs and the
"GPU KV cache size" a 10 GiB budget gives, beside reconcile's figures. Writes
$OUT/preflight-oracle.json and $OUT/preflight-oracle.md. Usage: tools/preflight_oracle.sh [names...]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconcile.engine.attention import Build, mla_backend, scan_build  # noqa: E402
from reconcile.engine.kvgroups import kv_layout  # noqa: E402
from reconcile.engine.kvspec import MAMBA, layer_specs  # noqa: E402
from reconcile.engine.limits import derive_max_model_len  # noqa: E402
from reconcile.engine.memory import DTYPE_BYTES, cuda_total, ssm_dtype  # noqa: E402
from reconcile.engine.servedefaults import in_flight_tokens, mamba_cache_mode, v2_runner  # noqa: E402
from reconcile.engine.shape import model_shape  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "model_configs"
GiB = 1024**3
BUDGET = 10 * GiB  # KV cache memory both sides turn into a token count
VERSION = "0.26.0"
# Bumped when vllm_side records something new: a cached vLLM row of another version is redone.
ORACLE_VERSION = 3
# Corpus configs served another way: name -> (corpus config, the server's flags, a config.json patch).
# The reference spec (specs/blackwell-2x5090.toml): its model with the spec's yarn patch, fp8 KV, 1M
# tokens and prefix caching on, which puts NemotronH in vLLM 0.26's "all" Mamba cache mode.
_YARN_1M = {
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
}
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "nemotron-3-nano+prefix-caching": ("nemotron-3-nano-30b-a3b", {"enable-prefix-caching": True}, {}),
    "reference-spec": (
        "nemotron-3-nano-30b-a3b",
        {"enable-prefix-caching": True, "kv-cache-dtype": "fp8", "max-model-len": 1048576},
        _YARN_1M,
    ),
}  # fmt: skip
# The GPU the reconcile side plans for, and the MLA kernels the vLLM on sys.path holds (main sets it).
HOST: dict[str, Any] = {"capability": None, "build": None}


def load_entry(name: str) -> dict[str, Any]:
    """A corpus entry, or a variant's: the corpus config patched, with the server's flags in "args"."""
    if name not in VARIANTS:
        return dict(json.loads((CORPUS / f"{name}.json").read_text()), args={})
    base, args, patch = VARIANTS[name]
    entry = json.loads((CORPUS / f"{base}.json").read_text())
    return dict(entry, config={**entry["config"], **patch}, args=args)


def reconcile_side(entry: dict[str, Any], batched: int) -> dict[str, Any]:
    cfg, tp, args = entry["config"], entry["tp"], entry.get("args", {})
    d = derive_max_model_len(cfg, VERSION)
    length = int(args.get("max-model-len") or d.default)
    out: dict[str, Any] = {"derived": d.value, "max_model_len": length}
    ssm, mode = reconcile_mamba(cfg, args)
    out["mamba_cache_mode"] = mode
    shape = model_shape(cfg)
    in_flight = in_flight_tokens(batched, 1, True, v2_runner(cfg, shape))
    out["max_in_flight_tokens"] = in_flight
    kv = str(args.get("kv-cache-dtype", "auto"))
    backend = None
    if shape.mla_dim is not None:
        backend = mla_backend(HOST["capability"], cfg, kv_cache_dtype=kv, build=HOST["build"])
        out["attention_backend"] = backend.name
    for key, t in (("tp1", 1), ("tp", tp)):
        specs = layer_specs(
            cfg,
            tp=t,
            max_model_len=length,
            kv_dtype_bytes=1 if kv.startswith("fp8") else 2,
            mamba_ssm_bytes=ssm,
            mamba_mode=mode,
            backend_block=backend.block_size if backend else None,
        )
        layout = kv_layout(specs)
        out[key] = {
            "kinds": _count([s.kind for s in specs]),
            "kv_bytes_per_token": layout.kv_bytes_per_token,
            "block_size": layout.min_block_size,
            "groups": len(layout.groups),
            "one_request_bytes": layout.one_request_bytes(length, in_flight, mode),
            "capacity_tokens": layout.capacity_tokens(BUDGET),
            "logged_tokens": layout.capacity_tokens(BUDGET, length, in_flight, mode),
            "mamba_page_bytes": max((s.page_bytes for s in specs if s.kind == MAMBA), default=0),
        }
    return out


def host_facts() -> tuple[int | None, Build | None]:
    """The compute capability of GPU 0 (NVML, no CUDA context) and scan_build of sys.path."""
    cc = None
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        cc = int(major) * 10 + int(minor)
    return cc, scan_build([p for p in sys.path if p])


def reconcile_mamba(config: dict[str, Any], args: dict[str, Any] | None = None) -> tuple[int, str]:
    """(SSM state bytes, Mamba cache mode) as engine.memory.estimate picks them for a bf16 model
    served with these flags (vLLM 0.26: a hybrid's prefix caching is off unless asked for)."""
    shape = model_shape(config)
    ssm = DTYPE_BYTES.get(ssm_dtype(None, shape, "bfloat16"), 2)
    return ssm, mamba_cache_mode(config, shape, args or {})


def _count(kinds: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kinds:
        out[k] = out.get(k, 0) + 1
    return out


# vLLM's spec classes -> reconcile's kind names
_KIND = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local",
    "MLAAttentionSpec": "mla",
    "MambaSpec": "mamba",
}


def vllm_side(name: str, entry: dict[str, Any], work: Path) -> dict[str, Any]:
    """vLLM's figures for one corpus config (TP 1 from the real layer objects; the corpus TP by
    re-deriving heads and Mamba shapes with vLLM's own functions)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_dir = work / name
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = dict(entry["config"])
    # Weight quantization does not change the KV spec here (bf16 KV) and needs kernels to build.
    cfg.pop("quantization_config", None)
    (model_dir / "config.json").write_text(json.dumps(cfg))
    flags = entry.get("args", {})
    extra: dict[str, Any] = {"kv_cache_dtype": flags.get("kv-cache-dtype", "auto")}
    if "enable-prefix-caching" in flags:
        extra["enable_prefix_caching"] = bool(flags["enable-prefix-caching"])

    def engine_config(max_model_len: int | None) -> Any:
        args = EngineArgs(
            model=str(model_dir),
            skip_tokenizer_init=True,
            enforce_eager=True,
            load_format="dummy",
            max_model_len=max_model_len,
            dtype="bfloat16",
            **extra,
        )
        return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)

    out: dict[str, Any] = {}
    vc = engine_config(flags.get("max-model-len"))
    mc, cc, sc = vc.model_config, vc.cache_config, vc.scheduler_config
    out["max_model_len"] = mc.max_model_len
    out["max_num_batched_tokens"] = sc.max_num_batched_tokens
    out["max_in_flight_tokens"] = vc.max_in_flight_tokens
    out["enable_prefix_caching"] = bool(cc.enable_prefix_caching)
    default_block = cc.block_size
    # The derived limit: vLLM accepts it and refuses one more token.
    derived = derive_max_model_len(entry["config"], VERSION).value
    try:
        engine_config(derived + 1)
        out["derived_check"] = f"accepted {derived + 1}"
    except Exception as exc:  # vLLM raises ValueError (or a pydantic ValidationError wrapping it)
        m = re.search(r"derived max_model_len \((\w+)=([\d.]+)", str(exc))
        out["derived"] = int(float(m.group(2))) if m else None
        out["derived_check"] = "refused +1" if m else f"refused: {str(exc)[:160]}"

    # As the model loader does (BaseModelLoader.load_model): the model dtype is the default while
    # layers are built, so each attention layer picks its backend for bf16, not float32 (no MLA
    # backend takes float32). Then, as the executor does after load_model, the platform sets the
    # block size for that backend and pads hybrid models' Mamba pages to the attention page.
    with set_current_vllm_config(vc):
        _init_distributed()
        with set_default_torch_dtype(mc.dtype), torch.device("meta"):
            model = _build(vc)
        current_platform.update_block_size_for_backend(vc)
        with contextlib.suppress(Exception):  # the backend the block size came from (the first non-SSM)
            out["attention_backend"] = current_platform._find_non_ssm_backend(vc).get_name()
    out["block_size"] = cc.block_size
    out["mamba_cache_mode"] = str(getattr(cc, "mamba_cache_mode", None))
    specs = _layer_specs(vc)
    out["tp1"] = _figures(vc, specs)
    del model

    tp = entry["tp"]
    if tp != 1:
        out["tp"] = _figures(vc, _at_tp(vc, specs, tp, default_block))
    else:
        out["tp"] = out["tp1"]
    return out


def _build(vc: Any) -> Any:
    try:
        from vllm.model_executor.model_loader.utils import initialize_model

        return initialize_model(vllm_config=vc, prefix="")
    except ImportError:
        from vllm.model_executor.models import ModelRegistry

        cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architectures, model_config=vc.model_config)
        return cls(vllm_config=vc, prefix="")


def _layer_specs(vc: Any) -> dict[str, Any]:
    """What GPUModelRunner.get_kv_cache_spec collects: each registered layer's own spec."""
    specs = {}
    for layer_name, layer in vc.compilation_config.static_forward_context.items():
        get = getattr(layer, "get_kv_cache_spec", None)
        if get is None:
            continue
        spec = get(vc)
        if spec is not None:
            specs[layer_name] = spec
    return specs


def _at_tp(vc: Any, specs: dict[str, Any], tp: int, default_block: int) -> dict[str, Any]:
    """The TP-1 specs as a TP-`tp` rank holds them: KV heads from ModelConfig.get_num_kv_heads, Mamba
    shapes from the model class, block size and padding from Platform.update_block_size_for_backend."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    pc, cc, mc = vc.parallel_config, vc.cache_config, vc.model_config
    saved = (pc.tensor_parallel_size, cc.block_size, getattr(cc, "mamba_page_size_padded", None))
    pc.tensor_parallel_size = tp
    heads = mc.get_num_kv_heads(pc)
    block = cc.block_size
    padded = None
    shapes = None
    mamba_block = None
    if any(isinstance(s, MambaSpec) for s in specs.values()):
        cls, _ = ModelRegistry.resolve_model_cls(mc.architectures, model_config=mc)
        shapes = cls.get_mamba_state_shape_from_config(vc)
        saved_mamba_block = getattr(cc, "mamba_block_size", None)
        cc.block_size = default_block
        cc.mamba_page_size_padded = None
        with set_current_vllm_config(vc):
            current_platform.update_block_size_for_backend(vc)
        block, padded = cc.block_size, cc.mamba_page_size_padded
        mamba_block = getattr(cc, "mamba_block_size", None)
        if hasattr(cc, "mamba_block_size"):
            cc.mamba_block_size = saved_mamba_block
    out = {}
    for n, s in specs.items():
        if isinstance(s, MambaSpec):
            out[n] = dataclasses.replace(
                s, shapes=shapes, page_size_padded=padded, block_size=mamba_block or s.block_size
            )
        elif isinstance(s, AttentionSpec):
            mla = type(s).__name__ == "MLAAttentionSpec"
            out[n] = dataclasses.replace(s, num_kv_heads=s.num_kv_heads if mla else heads, block_size=block)
        else:
            out[n] = s
    pc.tensor_parallel_size, cc.block_size = saved[0], saved[1]
    if hasattr(cc, "mamba_page_size_padded"):
        cc.mamba_page_size_padded = saved[2]
    return out


def _figures(vc: Any, specs: dict[str, Any]) -> dict[str, Any]:
    from vllm.v1.core import kv_cache_utils as ku

    kinds = _count([_KIND.get(type(s).__name__, type(s).__name__) for s in specs.values()])
    attn = [s for s in specs.values() if type(s).__name__ != "MambaSpec"]
    groups = ku.get_kv_cache_groups(vc, dict(specs))
    figures: dict[str, Any] = {
        "kinds": kinds,
        "kv_bytes_per_token": sum(s.page_size_bytes // s.block_size for s in attn),
        "block_size": min(g.kv_cache_spec.block_size for g in groups) if groups else 0,
        "groups": len(groups),
        "group_specs": [
            f"{type(g.kv_cache_spec).__name__} x{len(g.layer_names)} page {g.kv_cache_spec.page_size_bytes}"
            for g in groups
        ],
        "mamba_page_bytes": max(
            (s.page_size_bytes for s in specs.values() if type(s).__name__ == "MambaSpec"), default=0
        ),
    }
    needed = getattr(ku, "_max_memory_usage_bytes_from_groups", None)
    if needed is not None:
        figures["one_request_bytes"] = needed(vc, groups)
    else:
        figures["one_request_bytes"] = ku.max_memory_usage_bytes(vc, specs.values())
    try:
        config = ku.get_kv_cache_config_from_groups(vc, groups, BUDGET)
    except TypeError:  # releases where it also takes the per-layer specs
        config = ku.get_kv_cache_config_from_groups(vc, groups, dict(specs), BUDGET)
    min_block = min(g.kv_cache_spec.block_size for g in config.kv_cache_groups)
    figures["capacity_tokens"] = config.num_blocks // len(config.kv_cache_groups) * min_block
    capacity = getattr(ku, "get_kv_cache_capacity", None)  # what "GPU KV cache size: N tokens" logs
    if capacity is not None:
        figures["logged_tokens"] = capacity(vc, config)[0]
    return figures


COMPARED = ("kinds", "kv_bytes_per_token", "block_size", "groups", "one_request_bytes", "capacity_tokens",
            "logged_tokens")  # fmt: skip


def compare(v: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """The figures that differ, as 'tp.kinds: vLLM {...} reconcile {...}'."""
    diffs = []
    if v.get("max_model_len") != r["max_model_len"]:
        diffs.append(f"max_model_len: vLLM {v.get('max_model_len')} reconcile {r['max_model_len']}")
    if r["tp1"]["mamba_page_bytes"] and v.get("mamba_cache_mode") != r["mamba_cache_mode"]:
        diffs.append(f"mamba_cache_mode: vLLM {v.get('mamba_cache_mode')} reconcile {r['mamba_cache_mode']}")
    if "max_in_flight_tokens" in v and v["max_in_flight_tokens"] != r["max_in_flight_tokens"]:
        diffs.append(
            f"max_in_flight_tokens: vLLM {v['max_in_flight_tokens']} reconcile {r['max_in_flight_tokens']}"
        )
    if r.get("attention_backend") and v.get("attention_backend") != r["attention_backend"]:
        diffs.append(
            f"attention_backend: vLLM {v.get('attention_backend')} reconcile {r['attention_backend']}"
        )
    if v.get("derived") not in (None, r["derived"]):
        diffs.append(f"derived: vLLM {v.get('derived')} reconcile {r['derived']}")
    for key in ("tp1", "tp"):
        for f in COMPARED:
            if key in v and f in v[key] and v[key][f] != r[key][f]:
                diffs.append(f"{key}.{f}: vLLM {v[key].get(f)} reconcile {r[key][f]}")
    return diffs


def memory_totals() -> dict[str, Any]:
    """CUDA's total (what vLLM budgets from) vs NVML's, and reconcile's conversion."""
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        import torch

        _free, total = torch.cuda.mem_get_info()
        out["cuda_total"] = int(total)
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        out["nvml_total"], out["nvml_reserved"] = int(m.total), int(m.reserved)
        out["reconcile_cuda_total"] = cuda_total(int(m.total), int(m.reserved))
    return out


def cuda_probe() -> dict[str, Any]:
    """What probes.gpu.cuda_mem_info costs from a cold process (a CUDA context), and its total."""
    from probes.gpu import cuda_mem_info

    started = time.monotonic()
    got = cuda_mem_info(0)
    took = round(time.monotonic() - started, 3)
    if isinstance(got, tuple):
        return {"cuMemGetInfo_total": got[1], "cuMemGetInfo_seconds": took}
    return {"cuMemGetInfo_error": got.reason, "cuMemGetInfo_seconds": took}


def markdown(rows: list[dict[str, Any]], totals: dict[str, Any]) -> str:
    lines = [
        f"vLLM {VERSION} oracle; KV budget {BUDGET // GiB} GiB; bf16 KV; figures per GPU at the corpus TP.",
        "",
        "| model | TP | max_model_len vLLM / rec. | KV B/token/GPU vLLM / rec. | groups | block | "
        "one request (MiB) vLLM / rec. | tokens in 10 GiB vLLM / rec. | logged tokens vLLM / rec. | agree |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        v, r = row.get("vllm", {}), row["reconcile"]
        vt, rt = v.get("tp", {}), r["tp"]
        mib = 1024**2
        one_v = f"{vt['one_request_bytes'] / mib:,.1f}" if "one_request_bytes" in vt else "-"
        agree = "yes" if row.get("agree") else ("ERROR" if row.get("error") else "NO")
        lines.append(
            f"| {row['name']} | {row['tp']} | {v.get('max_model_len', '-')} / {r['max_model_len']} | "
            f"{vt.get('kv_bytes_per_token', '-')} / {rt['kv_bytes_per_token']} | "
            f"{vt.get('groups', '-')} / {rt['groups']} | "
            f"{vt.get('block_size', '-')} / {rt['block_size']}{_backends(v, r)} | "
            f"{one_v} / {rt['one_request_bytes'] / mib:,.1f} | "
            f"{vt.get('capacity_tokens', '-')} / {rt['capacity_tokens']} | "
            f"{vt.get('logged_tokens', '-')} / {rt['logged_tokens']} | {agree} |"
        )
    for row in rows:
        if row.get("diffs") or row.get("error"):
            lines.append(f"\n{row['name']}: " + "; ".join(row.get("diffs") or [row.get("error", "")]))
    lines.append(f"\nmemory totals: {json.dumps(totals)}")
    return "\n".join(lines) + "\n"


def _backends(v: dict[str, Any], r: dict[str, Any]) -> str:
    """ " (vLLM's backend / reconcile's)" for MLA rows, where the block size follows the backend."""
    if not r.get("attention_backend"):
        return ""
    return f" ({v.get('attention_backend', '-')} / {r['attention_backend']})"


def main(argv: list[str]) -> int:
    out_dir = Path(os.environ.get("OUT") or ".")
    state = Path(os.environ.get("ORACLE_STATE", "/tmp/preflight-oracle"))
    state.mkdir(parents=True, exist_ok=True)
    names = argv or [*sorted(p.stem for p in CORPUS.glob("*.json")), *VARIANTS]
    probe = cuda_probe()  # first, before anything in this process has a CUDA context
    HOST["capability"], HOST["build"] = host_facts()
    print(f"reconcile plans for sm_{HOST['capability']} with {HOST['build']}", flush=True)
    rows = []
    row: dict[str, Any]
    for name in names:
        done = state / f"{name}.json"
        entry = load_entry(name)
        cached = json.loads(done.read_text()) if done.exists() else {}
        if cached.get("oracle_version") == ORACLE_VERSION and "vllm" in cached:
            # Resumable: vLLM's figures (the slow part) are kept; reconcile's are recomputed, so a
            # re-run after an engine fix compares the new engine with the same vLLM figures.
            row = {k: cached[k] for k in ("name", "tp", "vllm", "seconds", "oracle_version")}
            row["reconcile"] = reconcile_side(entry, row["vllm"]["max_num_batched_tokens"])
            row["diffs"] = compare(row["vllm"], row["reconcile"])
            row["agree"] = not row["diffs"]
            print(f"{name} (vLLM cached): {'agree' if row['agree'] else row['diffs']}", flush=True)
            rows.append(row)
            continue
        started = time.monotonic()
        row = {"name": name, "tp": entry["tp"], "oracle_version": ORACLE_VERSION}
        try:
            row["vllm"] = vllm_side(name, entry, Path(tempfile.mkdtemp(prefix="oracle-")))
            row["reconcile"] = reconcile_side(entry, row["vllm"]["max_num_batched_tokens"])
            row["diffs"] = compare(row["vllm"], row["reconcile"])
            row["agree"] = not row["diffs"]
        except Exception as exc:  # not cached as done (no oracle_version match needed: no "vllm" key)
            row.pop("vllm", None)
            row.setdefault("reconcile", reconcile_side(entry, 8192))
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            row["traceback"] = traceback.format_exc()[-2000:]
        row["seconds"] = round(time.monotonic() - started, 1)
        print(f"{name}: {'agree' if row.get('agree') else row.get('diffs') or row.get('error')}", flush=True)
        done.write_text(json.dumps(row, indent=1))
        rows.append(row)
    totals = {**memory_totals(), **probe, "capability": HOST["capability"]}
    totals["build"] = HOST["build"]._asdict() if HOST["build"] else None
    (out_dir / "preflight-oracle.json").write_text(json.dumps({"totals": totals, "rows": rows}, indent=1))
    (out_dir / "preflight-oracle.md").write_text(markdown(rows, totals))
    print(markdown(rows, totals))
    return 0 if all(r.get("agree") for r in rows) else 1


_DISTRIBUTED: list[bool] = []


def _init_distributed() -> None:
    """A one-rank process group, once, so vLLM's parallel layers can be built (TP 1)."""
    if _DISTRIBUTED:
        return
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    _DISTRIBUTED.append(True)
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method="tcp://127.0.0.1:29517", backend="gloo"
    )
    initialize_model_parallel(1, 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
