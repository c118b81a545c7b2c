"""vLLM 0.26's serve-time defaults that size the KV cache: the Mamba cache mode (prefix caching),
the model runner, the tokens in flight and the hybrid KV cache manager. Used by engine.memory.estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.vllm.kvspec import CHUNKED, LayerSpec
from reconcile.vllm.shape import ModelShape


def in_flight_tokens(batched_tokens: int, pp: int, async_scheduling: bool, v2_runner: bool) -> int:
    """vLLM 0.26's `max_in_flight_tokens`: tokens scheduled but not yet freed, a full batch for each
    concurrent step (VllmConfig.max_concurrent_batches: async scheduling overlaps two steps; PP keeps
    one a stage, plus one with the V2 model runner). A sliding window holds its window plus these:
    gemma-3-4b-it at 8,192 batched tokens keeps 1,023 + 16,384 tokens a sliding layer (the H200 oracle)."""
    if async_scheduling and v2_runner:
        batches = pp + 1
    elif async_scheduling and pp <= 1:
        batches = 2
    else:
        batches = pp
    return batches * batched_tokens


# Models whose vLLM class is SupportsMambaPrefixCaching: prefix caching keeps their state per block ("all").
_MAMBA_PREFIX_CACHING = {
    "NemotronHForCausalLM", "JambaForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM", "Zamba2ForCausalLM",
    "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM",
}  # fmt: skip
# Architectures vLLM 0.26 runs on its V2 model runner although MoE (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES).
_V2_MOE = {"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def mamba_cache_mode(config: Mapping[str, Any], shape: ModelShape, args: Mapping[str, Any]) -> str:
    """vLLM 0.26's cache_config.mamba_cache_mode. Prefix caching is on by default except for hybrid
    (attention + Mamba) models, where it is opt-in (EngineArgs: "keep it opt-in for now"); on, a Mamba
    layer keeps its state per block ("all") where the model supports it, else 2 blocks ("align").
    Off, one state a request ("none"): the H200 serve of a tiny NemotronH logged 27,197,440 tokens."""
    if shape.mamba is None:
        return "none"
    hybrid = shape.attention_layers > 0
    if not on(args, "enable-prefix-caching", default=not hybrid):
        return "none"
    archs = config.get("architectures")
    supported = isinstance(archs, list) and bool(_MAMBA_PREFIX_CACHING.intersection(archs))
    asked = args.get("mamba-cache-mode")
    if asked in ("align", "all"):  # --mamba-cache-mode; "all" falls back to "align" where unsupported
        return "align" if asked == "all" and not supported else str(asked)
    return "all" if supported else "align"


def v2_runner(config: Mapping[str, Any], shape: ModelShape) -> bool:
    """vLLM 0.26's default model runner is V2 for generative models neither hybrid nor MoE."""
    if shape.mamba is not None:
        return False
    archs = config.get("architectures")
    if isinstance(archs, list) and _V2_MOE.intersection(archs):
        return True
    inner = config.get("text_config")
    cfgs = [config, inner] if isinstance(inner, Mapping) else [config]
    return not any(isinstance(c.get(k), int) and c.get(k) for c in cfgs for k in _MOE_KEYS)


def on(args: Mapping[str, Any], flag: str, default: bool = True) -> bool:
    """A vLLM on/off flag as the spec sets it: `flag = false` or `no-flag = true` turns it off."""
    if args.get(flag) is False or args.get(f"no-{flag}") is True:
        return False
    if args.get(flag) is True:
        return True
    return default


def hybrid_manager(
    args: Mapping[str, Any], specs: tuple[LayerSpec, ...], env: Mapping[str, str] | None = None
) -> bool:
    """Whether vLLM keeps separate KV cache groups (VllmConfig's hybrid KV cache manager rules).
    --disable-hybrid-kv-cache-manager turns it off for every model. Chunked local attention (Llama 4)
    turns it off only with VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0: vLLM 0.26's default
    for that variable is 1 (vllm/envs.py), so the chunked layers keep only their chunk."""
    flag = args.get("disable-hybrid-kv-cache-manager")
    if isinstance(flag, bool):
        return not flag
    allow = (env or {}).get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "1").strip()
    return allow not in ("0", "") or not any(s.kind == CHUNKED for s in specs)
