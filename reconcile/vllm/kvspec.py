"""Per-layer KV-cache specs of a model on one GPU, as vLLM's model runner builds them (v1 engine).

Mirrors vllm/v1/kv_cache_interface.py: full attention, sliding window, chunked local attention, MLA
and Mamba-style state layers, with vLLM's page sizes and the hybrid Mamba block-size/padding rule
(vllm/model_executor/models/config.py, HybridAttentionMambaModelConfig). Grouped by engine.kvgroups.
"""

from __future__ import annotations

__all__ = ["LayerSpec", "ShapeError", "layer_kinds", "layer_specs", "mamba_state", "pp_layers"]

import math
from collections.abc import Mapping, Sequence
from typing import Any

from reconcile.record import Record
from reconcile.vllm.architectures import latent_cache
from reconcile.vllm.attention import DEFAULT_BLOCK
from reconcile.vllm.families import Resolved, layer_geometry, resolve
from reconcile.vllm.shape import ShapeError, config_int, mamba2_dims

FULL, SLIDING, CHUNKED, MLA, MAMBA = "full", "sliding_window", "chunked_local", "mla", "mamba"
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED, MLA)
_ATTN_NAMES = {"*", "attention", "full_attention", "global", "hybrid"}
_MAMBA1 = {"jamba", "mamba", "falcon_mamba"}  # Mamba-1 mixers: (conv, ssm) of expand x hidden
_MAMBA_NAMES = {"m", "mamba", "mamba2", "linear_attention", "linear"}
_EVERY_LAYER_MAMBA = {"zamba2"}


class LayerSpec(Record):
    """The cache one layer keeps on one GPU (vLLM's KVCacheSpec of that layer)."""

    layer: int  # decoder layer index
    kind: str  # FULL | SLIDING | CHUNKED | MLA | MAMBA
    num_kv_heads: int  # per GPU (MLA: 1, the latent vector)
    head_size: int
    dtype_bytes: int
    window: int | None  # sliding window or attention chunk size
    block_size: int  # tokens per block (Mamba without prefix caching: max_model_len)
    page_bytes: int  # one block of this layer after vLLM's padding
    mamba_shapes: tuple[tuple[int, ...], ...] = ()
    mamba_dtype_bytes: tuple[int, ...] = ()

    @property
    def real_page_bytes(self) -> int:
        """Page size before padding (what the state or the tokens actually take)."""
        if self.kind == MAMBA:
            return sum(
                math.prod(s) * b for s, b in zip(self.mamba_shapes, self.mamba_dtype_bytes, strict=True)
            )
        factor = 1 if self.kind == MLA else 2  # MLA keeps one latent vector, not K and V
        return self.block_size * self.num_kv_heads * self.head_size * factor * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token takes in this layer on this GPU (0 for Mamba: fixed per sequence)."""
        return 0 if self.kind == MAMBA else self.page_bytes // self.block_size

    def max_memory_bytes(self, max_model_len: int, in_flight_tokens: int, mamba_mode: str = "none") -> int:
        """vLLM's `max_memory_usage_bytes`: what one request of max_model_len needs in this layer.
        `in_flight_tokens` is vLLM's `max_in_flight_tokens` (engine.budget.in_flight_tokens): a window
        layer keeps its window plus every batch scheduled but not yet freed."""
        if self.kind == MAMBA:
            if mamba_mode == "all":
                return _cdiv(max_model_len, self.block_size) * self.page_bytes
            return self.page_bytes * (2 if mamba_mode == "align" else 1)
        if self.kind == SLIDING and self.window is not None:
            tokens = min(self.window - 1 + in_flight_tokens, max_model_len)
            return (_cdiv(tokens, self.block_size) + 1) * self.page_bytes  # the window may straddle a block
        if self.kind == CHUNKED and self.window is not None:
            tokens = min(self.window + in_flight_tokens, max_model_len)
            return _cdiv(tokens, self.block_size) * self.page_bytes
        return _cdiv(max_model_len, self.block_size) * self.page_bytes

    def with_block_size(self, block_size: int) -> LayerSpec:
        """The spec with larger blocks (vLLM's copy_with_new_block_size: padding scales too)."""
        ratio = block_size // self.block_size
        return self._replace(block_size=block_size, page_bytes=self.page_bytes * ratio)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def layer_kinds(cfg: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """For each decoder layer, the caches it holds: () for MLP-only layers, (MAMBA,), (FULL,), or
    (FULL, MAMBA) for Falcon-H1's parallel hybrid layers. Sliding/chunked come from layer_types."""
    mla = latent_cache(cfg)
    attn = MLA if mla else (SLIDING if isinstance(cfg.get("sliding_window"), int) else FULL)
    pattern = cfg.get("hybrid_override_pattern")
    names: list[str] | None = None
    if isinstance(pattern, str) and pattern:
        names = list(pattern.lower())
    else:
        for key in ("layers_block_type", "layer_types"):
            value = cfg.get(key)
            if isinstance(value, list) and value:
                names = [str(n).lower() for n in value]
                break
    if str(cfg.get("model_type", "")).startswith("falcon_h1"):
        return tuple((attn, MAMBA) for _ in range(config_int(cfg, "num_hidden_layers")))
    if str(cfg.get("model_type", "")) in _EVERY_LAYER_MAMBA and names is not None:
        # Zamba2: every layer runs a Mamba mixer; a "hybrid" one also runs the shared attention
        # block, with a KV cache of its own (vllm zamba2.py: one Attention per hybrid layer).
        return tuple((FULL, MAMBA) if n == "hybrid" else (MAMBA,) for n in names)
    if names is None:
        return tuple((attn,) for _ in range(config_int(cfg, "num_hidden_layers", "n_layer", "num_layers")))
    out: list[tuple[str, ...]] = []
    for n in names:
        if n == "sliding_attention":
            out.append((SLIDING if isinstance(cfg.get("sliding_window"), int) else FULL,))
        elif n == "chunked_attention":
            out.append((CHUNKED if isinstance(cfg.get("attention_chunk_size"), int) else FULL,))
        elif n in _ATTN_NAMES:
            out.append((MLA if mla else FULL,))
        elif n in _MAMBA_NAMES:
            out.append((MAMBA,))
        else:  # "-", "e", "mlp", "moe": no cache
            out.append(())
    return tuple(out)


class MambaState(Record):
    shapes: tuple[tuple[int, ...], ...]
    dtype_bytes: tuple[int, ...]


def mamba_state(cfg: Mapping[str, Any], tp: int, conv_bytes: int, ssm_bytes: int) -> MambaState:
    """State shapes of one Mamba-style layer on one GPU (vLLM's MambaStateShapeCalculator)."""
    mt = str(cfg.get("model_type", ""))
    if mt in _MAMBA1:
        inner = config_int(cfg, "mamba_expand") * config_int(cfg, "hidden_size")  # Mamba-1
        kernel = config_int(cfg, "mamba_d_conv", "conv_kernel")
        state = config_int(cfg, "mamba_d_state", "ssm_state_size", "state_size")
        return MambaState(((kernel - 1, inner // tp), (inner // tp, state)), (conv_bytes, ssm_bytes))
    if "linear_num_value_heads" in cfg:  # Qwen3-Next / Qwen3.5 gated delta net
        kh, vh = config_int(cfg, "linear_num_key_heads"), config_int(cfg, "linear_num_value_heads")
        kd, vd = config_int(cfg, "linear_key_head_dim"), config_int(cfg, "linear_value_head_dim")
        kernel = config_int(cfg, "linear_conv_kernel_dim")
        conv = (kernel - 1, (2 * kh * kd + vh * vd) // tp)
        return MambaState((conv, (vh // tp, vd, kd)), (conv_bytes, ssm_bytes))
    d = mamba2_dims(cfg, tp)
    conv = (d.kernel - 1, (d.inner + 2 * d.groups * d.state) // tp)
    return MambaState((conv, (d.heads // tp, d.head_dim, d.state)), (conv_bytes, ssm_bytes))


def pp_layers(num_layers: int, pp: int, rank: int) -> range:
    """The layers pipeline rank `rank` of `pp` holds (vLLM's get_pp_indices: the remainder goes to
    the ranks before the last)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    start = sum(parts[:rank])
    return range(start, start + parts[rank])


def attention_geometry(cfg: Mapping[str, Any], tp: int) -> tuple[int, int]:
    """(KV heads per GPU, head size) of the model's attention layers as vLLM's model code builds
    them: a family's own rule where its code ignores config.json (engine.families.layer_geometry:
    Cohere2's head size is hidden_size // heads whatever head_dim says), else ModelConfig's view."""
    kv, head = config_geometry(cfg, tp)
    if latent_cache(cfg):
        return kv, head
    layer_kv, layer_head = layer_geometry(cfg)
    return (max(1, layer_kv // tp) if layer_kv else kv), (layer_head or head)


def config_geometry(cfg: Mapping[str, Any], tp: int) -> tuple[int, int]:
    """(KV heads per GPU, head size) vLLM's ModelConfig.get_num_kv_heads / get_head_size give
    (model_arch_config_convertor: head_dim, hidden_size_per_head, else hidden_size // heads). The
    hybrid Mamba alignment sizes the attention page from these, not from the layers."""
    if latent_cache(cfg):
        return 1, int(cfg["kv_lora_rank"]) + config_int(cfg, "qk_rope_head_dim", default=0)
    heads = config_int(cfg, "num_attention_heads", "n_head")
    kv = config_int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    hidden = config_int(cfg, "hidden_size", "d_model", "n_embd")
    head = config_int(cfg, "head_dim", "hidden_size_per_head", "attention_head_dim", default=hidden // heads)
    return max(1, kv // tp), head


def layer_specs(
    config: Mapping[str, Any] | Resolved,
    *,
    tp: int = 1,
    pp: int = 1,
    pp_rank: int | None = None,
    kv_dtype_bytes: int = 2,
    mamba_conv_bytes: int = 2,
    mamba_ssm_bytes: int = 2,
    block_size: int | None = None,
    max_model_len: int = 0,
    mamba_mode: str = "none",
    backend_block: int | None = None,
    mamba_block_size: int | None = None,
) -> tuple[LayerSpec, ...]:
    """The KV-cache spec of every cache-holding layer on one GPU, in layer order.

    `pp_rank` None: all layers (PP ranks are projected by engine.kvgroups). `block_size` is
    --block-size; else `backend_block`, the block the attention backend prefers (an MLA backend's:
    engine.attention.mla_backend), else 16. Hybrid Mamba models get vLLM's attention block size and
    Mamba padding on top of it; `mamba_block_size` is --mamba-block-size (the base of "all" mode's
    attention block instead of the SSD chunk).
    """
    resolved = config if isinstance(config, Resolved) else resolve(config)
    cfg = resolved.config
    kinds = layer_kinds(cfg)
    rank_layers = set(range(len(kinds))) if pp_rank is None else set(pp_layers(len(kinds), pp, pp_rank))
    has_attention = any(k != (MAMBA,) and k for k in kinds)
    kv_heads, head = attention_geometry(cfg, tp) if has_attention else (0, 0)
    has_mla = any(MLA in k for k in kinds)
    # Platform.update_block_size_for_backend, phase 1: the user's block, else the backend's preferred.
    bs = block_size or backend_block or DEFAULT_BLOCK
    one_token = kv_heads * head * (1 if has_mla else 2) * kv_dtype_bytes
    # _align_hybrid_block_size sizes the attention page from ModelConfig's heads, not the layers'.
    align_kv, align_head = config_geometry(cfg, tp) if has_attention else (0, 0)
    align_token = align_kv * align_head * (1 if has_mla else 2) * kv_dtype_bytes
    mamba: MambaState | None = None
    mamba_page = 0
    if any(MAMBA in k for k in kinds):
        mamba = mamba_state(cfg, tp, mamba_conv_bytes, mamba_ssm_bytes)
        mamba_page = sum(math.prod(s) * b for s, b in zip(mamba.shapes, mamba.dtype_bytes, strict=True))
        if align_token:
            # _align_hybrid_block_size: the kernel alignment is max(the backend's smallest block, the
            # phase-1 block), which is the phase-1 block for every backend vLLM would select.
            align = bs
            needed = align * _cdiv(mamba_page, align * align_token)
            if mamba_mode == "all":  # prefix caching of Mamba state: blocks of whole SSD kernel chunks
                base = mamba_block_size or config_int(cfg, "mamba_chunk_size", "chunk_size", default=256)
                chunk = math.lcm(base, align)  # --mamba-block-size replaces the SSD chunk as the base
                needed = chunk * _cdiv(_cdiv(mamba_page, align_token), chunk)
            if bs < needed:
                bs = needed
            if bs * align_token < mamba_page:
                bs = _cdiv(mamba_page, align_token)
    attn_page = bs * one_token
    # The Mamba page is padded to ModelConfig's attention page; where the layers' page is larger,
    # unify_kv_cache_spec_page_size pads it again (engine.kvgroups).
    mamba_padded = max(mamba_page, bs * align_token) if align_token else mamba_page
    # Without prefix caching a Mamba "block" is a whole sequence (vLLM: mamba_block_size =
    # max_model_len); unknown length (auto): the attention block, so token counts stay sane.
    mamba_block = bs if mamba_mode in ("align", "all") or not max_model_len else max_model_len
    windows = {SLIDING: cfg.get("sliding_window"), CHUNKED: cfg.get("attention_chunk_size")}
    out: list[LayerSpec] = []
    for index, held in enumerate(kinds):
        if index not in rank_layers:
            continue
        for kind in held:
            if kind == MAMBA:
                assert mamba is not None
                page = mamba_padded
                out.append(
                    LayerSpec(index, MAMBA, 0, 0, 0, None, mamba_block, page, mamba.shapes, mamba.dtype_bytes)
                )
            else:
                window = windows.get(kind)
                out.append(
                    LayerSpec(
                        index,
                        kind,
                        kv_heads,
                        head,
                        kv_dtype_bytes,
                        int(window) if window else None,
                        bs,
                        attn_page,
                    )
                )
    return tuple(out)


def kinds_summary(specs: Sequence[LayerSpec]) -> dict[str, int]:
    """{kind: number of layers}, for messages and the oracle table."""
    out: dict[str, int] = {}
    for s in specs:
        out[s.kind] = out.get(s.kind, 0) + 1
    return out
