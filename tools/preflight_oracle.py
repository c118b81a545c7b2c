"""vLLM 0.26's own config and KV-cache code as the oracle for reconcile's memory engine (issue 14, a).

On the GPU lab machine (vLLM importable, no network), for every corpus config in
tests/data/model_configs: vLLM's derived max_model_len, its per-layer KV-cache specs (the model built
on the meta device, no weights), its KV cache groups, the memory one request needs and the
"GPU KV cache size" a 10 GiB budget gives, beside reconcile's figures (vLLM's side is
tools/oracle_vllm.py). Models run in $ORACLE_JOBS processes at once (default 6). Writes
$OUT/preflight-oracle.json and $OUT/preflight-oracle.md. Usage: tools/preflight_oracle.sh [names...]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconcile.vllm.attention import Build, mla_backend, scan_build  # noqa: E402
from reconcile.vllm.kvgroups import kv_layout  # noqa: E402
from reconcile.vllm.kvspec import MAMBA, layer_specs  # noqa: E402
from reconcile.vllm.limits import derive_max_model_len  # noqa: E402
from reconcile.vllm.memory import DTYPE_BYTES, ssm_dtype  # noqa: E402
from reconcile.vllm.servedefaults import in_flight_tokens, mamba_cache_mode, v2_runner  # noqa: E402
from reconcile.vllm.shape import model_shape  # noqa: E402
from tools.oracle_vllm import BUDGET, VERSION, GiB, count, cuda_probe, memory_totals, vllm_side  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "model_configs"
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
            "kinds": count([s.kind for s in specs]),
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


def markdown(rows: list[dict[str, Any]], totals: dict[str, Any]) -> str:
    lines = [
        f"vLLM {VERSION} oracle; KV budget {BUDGET // GiB} GiB; bf16 KV (reference-spec: fp8); "
        "figures per GPU at the corpus TP.",
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


def one_row(name: str, state: Path, attempted: bool) -> dict[str, Any]:
    """The row of one model: vLLM's figures from $ORACLE_STATE when there (a worker of this run may
    have just written them, errors included), else measured here; reconcile's always afresh."""
    done = state / f"{name}.json"
    entry = load_entry(name)
    cached = json.loads(done.read_text()) if done.exists() else {}
    if cached.get("oracle_version") == ORACLE_VERSION and ("vllm" in cached or attempted):
        # Resumable: vLLM's figures (the slow part) are kept; reconcile's are recomputed, so a
        # re-run after an engine fix compares the new engine with the same vLLM figures.
        row = {
            k: cached[k] for k in ("name", "tp", "vllm", "seconds", "oracle_version", "error") if k in cached
        }
        row["reconcile"] = reconcile_side(entry, row.get("vllm", {}).get("max_num_batched_tokens", 8192))
        if "vllm" in row:
            row["diffs"] = compare(row["vllm"], row["reconcile"])
            row["agree"] = not row["diffs"]
        print(
            f"{name} (vLLM cached): {'agree' if row.get('agree') else row.get('diffs') or row.get('error')}"
        )
        return row
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
    return row


def run_workers(names: list[str], jobs: int, state: Path) -> None:
    """Measure vLLM's side of `names` in `jobs` processes at once (each model takes ~20 s of CPU-bound
    config and meta-device building; the lab has 16 cores). Each worker writes its rows to the state
    dir and its log to state/worker-N.log; the caller then reads them."""
    procs = []
    for i in range(jobs):
        chunk = names[i::jobs]
        if not chunk:
            continue
        env = {**os.environ, "ORACLE_WORKER": str(i), "OUT": str(state / f"worker-{i}")}
        env.setdefault("OMP_NUM_THREADS", "2")  # jobs x torch's threads stay within the cores
        (state / f"worker-{i}").mkdir(exist_ok=True)
        log = (state / f"worker-{i}.log").open("w")
        argv = [sys.executable, __file__, *chunk]
        procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    # A TERM to this process (`timeout`) ends the workers too, so none outlives the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for proc, _log in procs:
            proc.wait()
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
            log.close()


def main(argv: list[str]) -> int:
    out_dir = Path(os.environ.get("OUT") or ".")
    state = Path(os.environ.get("ORACLE_STATE", "/tmp/preflight-oracle"))
    state.mkdir(parents=True, exist_ok=True)
    names = argv or [*sorted(p.stem for p in CORPUS.glob("*.json")), *VARIANTS]
    worker = "ORACLE_WORKER" in os.environ
    probe = {} if worker else cuda_probe()  # first, before anything in this process has a CUDA context
    HOST["capability"], HOST["build"] = host_facts()
    print(f"reconcile plans for sm_{HOST['capability']} with {HOST['build']}", flush=True)
    jobs = 1 if worker else max(1, int(os.environ.get("ORACLE_JOBS", "6")))
    attempted: set[str] = set()
    if jobs > 1:
        todo = [n for n in names if not one_row_cached(state / f"{n}.json")]
        if len(todo) > 1:
            run_workers(todo, jobs, state)
            attempted = set(todo)
    rows = [one_row(name, state, name in attempted) for name in names]
    totals = {**memory_totals(), **probe, "capability": HOST["capability"]}
    totals["build"] = HOST["build"]._asdict() if HOST["build"] else None
    (out_dir / "preflight-oracle.json").write_text(json.dumps({"totals": totals, "rows": rows}, indent=1))
    (out_dir / "preflight-oracle.md").write_text(markdown(rows, totals))
    print(markdown(rows, totals))
    return 0 if all(r.get("agree") for r in rows) else 1


def one_row_cached(done: Path) -> bool:
    if not done.exists():
        return False
    cached = json.loads(done.read_text())
    return cached.get("oracle_version") == ORACLE_VERSION and "vllm" in cached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
