"""The latent-attention (MLA) backend vLLM 0.26 picks on a GPU, and the KV block size it then uses.

Mirrors vllm/platforms/cuda.py (_get_backend_priorities, get_attn_backend_cls: the first valid
backend in priority order), each backend's validate_configuration, and Platform.update_block_size_for_
backend's phase 1 (AttentionBackend.get_preferred_block_size). What the build holds comes from
`scan_build`: file existence in the venv, no import. Used by engine.memory.estimate and the oracle.
"""

from __future__ import annotations

__all__ = ["STOCK_BUILD", "Backend", "Build", "mla_backend", "scan_build"]

import os
from collections.abc import Mapping, Sequence

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# CacheConfig.DEFAULT_BLOCK_SIZE: every non-MLA CUDA backend takes it (FLASH_ATTN, TRITON_ATTN and
# FLEX_ATTENTION MultipleOf(16), FLASHINFER [16, 32, 64, ...]), so only MLA moves the block size.
DEFAULT_BLOCK = 16
_16BIT = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")


class Build(Record):
    """What the installed vLLM can load for MLA (each the module its backend imports)."""

    fa3: bool  # vllm/vllm_flash_attn/_vllm_fa3_C*.so: FlashAttention 3 (flash_attn_interface.py)
    flashmla: bool  # vllm/_flashmla_C*.so and vllm/_flashmla_extension_C*.so (v1/attention/ops/flashmla.py)
    flashinfer: bool  # the flashinfer package (flashinfer_mla.py imports flashinfer.decode at the top)
    tokenspeed: bool  # the tokenspeed_mla package (tokenspeed_mla.py supports_combination imports it)


# The published vllm 0.26.0 wheel holds _vllm_fa3_C, _flashmla_C and _flashmla_extension_C, and
# declares flashinfer-python==0.6.14 and tokenspeed-mla==0.1.8: what a plain `pip install` brings.
STOCK_BUILD = Build(fa3=True, flashmla=True, flashinfer=True, tokenspeed=True)


def scan_build(dirs: Sequence[str]) -> Build | None:
    """The Build the interpreter with these sys.path dirs (site-packages, .pth dirs) sees; None when
    no vllm package is in any of them."""
    vllm = next(
        (os.path.join(d, "vllm") for d in dirs if os.path.isfile(os.path.join(d, "vllm", "__init__.py"))),
        None,
    )
    if vllm is None:
        return None

    def ext(*parts: str) -> bool:  # a compiled module: NAME.abi3.so or NAME.cpython-3XY-....so
        # glob's NAME.*so, without glob and fnmatch (their import and pattern: ~2 ms of a plan's start)
        stem = parts[-1] + "."
        try:
            names = os.listdir(os.path.join(vllm, *parts[:-1]))
        except OSError:
            return False
        return any(n.startswith(stem) and n.endswith("so") and len(n) >= len(stem) + 2 for n in names)

    def package(name: str) -> bool:
        return any(os.path.isfile(os.path.join(d, name, "__init__.py")) for d in dirs)

    return Build(
        fa3=ext("vllm_flash_attn", "_vllm_fa3_C"),
        flashmla=ext("_flashmla_C") and ext("_flashmla_extension_C"),
        flashinfer=package("flashinfer"),
        tokenspeed=package("tokenspeed_mla"),
    )


class Backend(Record):
    name: str  # vLLM's AttentionBackendEnum name, as its log prints it
    block_size: int  # tokens per KV block vLLM uses with it
    why: str  # for the memory table and the oracle


class _Rule(Record):
    sizes: tuple[int, ...]  # get_supported_kernel_block_sizes (MultipleOf(n) written as n: both
    # mean "a multiple of n" to supports_block_size, so that the framework block may be larger)
    majors: tuple[int, ...]  # supports_compute_capability (empty: any)
    kv_dtypes: tuple[str, ...]  # supported_kv_cache_dtypes


# vllm/v1/attention/backends/mla/<module>.py, each class's own values (vLLM 0.26.0).
_RULES: Mapping[str, _Rule] = {
    "FLASH_ATTN_MLA": _Rule((16,), (9,), _16BIT),  # flashattn_mla.py FlashAttnMLABackend
    "FLASHMLA": _Rule((64,), (9, 10), _16BIT + _FP8),  # flashmla.py FlashMLABackend
    "FLASHINFER_MLA": _Rule((32, 64), (10,), _16BIT + _FP8),  # flashinfer_mla.py
    "TOKENSPEED_MLA": _Rule((32, 64), (10,), _FP8),  # tokenspeed_mla.py TokenspeedMLABackend
    "CUTLASS_MLA": _Rule((128,), (10,), _16BIT + _FP8),  # cutlass_mla.py CutlassMLABackend
    "TRITON_MLA": _Rule((16,), (), _16BIT + _FP8),  # triton_mla.py TritonMLABackend
}
# vllm/platforms/cuda.py _get_backend_priorities(use_mla=True), dense (the sparse ones need index_topk).
_PRIORITY = {
    10: ("FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
    12: ("TRITON_MLA",),
}
_OTHER = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")


def _supports_block(rule: _Rule, block: int) -> bool:
    """AttentionBackend.supports_block_size: a multiple of one supported size."""
    return any(block % s == 0 for s in rule.sizes)


def _preferred(rule: _Rule) -> int:
    """AttentionBackend.get_preferred_block_size(16): 16 when supported, else the smallest size."""
    return DEFAULT_BLOCK if _supports_block(rule, DEFAULT_BLOCK) else min(rule.sizes)


def _reasons(
    name: str, major: int, kv: str, block: int | None, cfg: Mapping[str, Any], build: Build
) -> list[str]:
    """Why `name` is not valid here (validate_configuration, supports_combination); [] when it is."""
    rule = _RULES[name]
    out: list[str] = []
    if rule.majors and major not in rule.majors:
        out.append(f"sm_{major}x not supported")
    if kv not in rule.kv_dtypes:
        out.append(f"kv-cache-dtype {kv} not supported")
    if block is not None and not _supports_block(rule, block):
        out.append(f"block-size {block} not supported")
    nope, rope, v = (cfg.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    if name == "FLASH_ATTN_MLA" and not build.fa3:  # fa_utils.flash_attn_supports_mla: FA3 on sm_9x
        out.append("no FlashAttention 3 (_vllm_fa3_C) in the build")
    if name == "FLASHMLA":  # flashmla.is_flashmla_dense_supported: both extensions, sm_9x only
        if not build.flashmla:
            out.append("no _flashmla_C in the build")
        if major != 9:
            out.append("FlashMLA dense needs sm_9x")
    if name == "FLASHINFER_MLA":
        if not build.flashinfer:
            out.append("flashinfer not installed (ImportError)")
        if nope not in (64, 128, 192):
            out.append(f"qk_nope_head_dim {nope} not in 64/128/192")
    if name == "TOKENSPEED_MLA":
        if not build.tokenspeed:
            out.append("tokenspeed_mla not installed")
        if (nope, rope, v) != (128, 64, 128):
            out.append("needs DeepSeek-R1 dims (128, 64, 128)")
    return out


def mla_backend(
    capability: int | None,
    config: Mapping[str, Any],
    *,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    forced: str | None = None,
    build: Build | None = None,
) -> Backend:
    """The MLA backend and block size for a compute capability (vLLM's int: 9.0 -> 90) and the model's
    text config. `block_size` is --block-size (then the block stays the user's, as
    CacheConfig.user_specified_block_size keeps it), `forced` --attention-backend, `build` None: the
    stock wheel with its requirements (STOCK_BUILD). Capability unknown: "unknown" with 16, the block
    every GPU gets but sm_100 and Hopper with an fp8 KV cache."""
    kv = kv_cache_dtype.lower()
    kv = "auto" if kv in ("bf16", "fp16", "half") else kv
    b = STOCK_BUILD if build is None else build
    if capability is None:
        return Backend(
            "unknown", block_size or DEFAULT_BLOCK, "compute capability unknown: 16, the default block"
        )
    major = capability // 10
    if forced and forced.upper() in _RULES:  # get_attn_backend_cls: the selected backend, or an error
        name = forced.upper()
        bad = _reasons(name, major, kv, block_size, config, b)
        why = "--attention-backend" + (f"; vLLM refuses it here: {', '.join(bad)}" if bad else "")
        return Backend(name, block_size or _preferred(_RULES[name]), why)
    skipped: list[str] = []
    for name in _PRIORITY.get(major, _OTHER):
        bad = _reasons(name, major, kv, block_size, config, b)
        if not bad:
            why = f"sm_{capability}, kv {kv}" + (f"; not {'; not '.join(skipped)}" if skipped else "")
            return Backend(name, block_size or _preferred(_RULES[name]), why)
        skipped.append(f"{name} ({', '.join(bad)})")
    # No valid backend: vLLM fails at start ("No valid attention backend found"); keep the block.
    return Backend("none", block_size or DEFAULT_BLOCK, "no valid MLA backend: " + "; ".join(skipped))
