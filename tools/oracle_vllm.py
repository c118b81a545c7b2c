"""vLLM 0.26's side of the oracle (tools/preflight_oracle.py): its config code on one corpus entry,
the model built on the meta device, its per-layer KV specs and groups, and CUDA's memory totals.

Imported by tools/preflight_oracle.py on the GPU lab machine, where vLLM is importable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from reconcile.vllm.limits import derive_max_model_len
from reconcile.vllm.memory import cuda_total

GiB = 1024**3
BUDGET = 10 * GiB  # KV cache memory both sides turn into a token count
VERSION = "0.26.0"


def count(kinds: list[str]) -> dict[str, int]:
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

    kinds = count([_KIND.get(type(s).__name__, type(s).__name__) for s in specs.values()])
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


_DISTRIBUTED: list[bool] = []


def _init_distributed() -> None:
    """A one-rank process group (once a process) and model-parallel groups made afresh for the model
    under the current vLLM config: whether an expert-parallel group exists is decided from the config
    at this call, so groups left from a dense model make the next MoE model fail (TP 1)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import destroy_model_parallel

    if not _DISTRIBUTED:
        _DISTRIBUTED.append(True)
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            # one port a worker process (run_workers): their process groups must not meet
            distributed_init_method=f"tcp://127.0.0.1:{29517 + int(os.environ.get('ORACLE_WORKER', '0'))}",
            backend="gloo",
        )
    else:
        destroy_model_parallel()
    initialize_model_parallel(1, 1)
