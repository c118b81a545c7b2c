"""The dtypes a vLLM deployment keeps: the model's, the KV cache's (flag, hf_quant_config.json or
config.json's quantization_config) and the Mamba state's, with their sizes. Used by engine.memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.vllm.shape import ModelShape

DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1, "uint8": 1,
}  # fmt: skip


def model_dtype(dtype_arg: str | None, shape: ModelShape) -> str:
    """The dtype vLLM runs the model in: --dtype, else the config's (float32 is served as bfloat16)."""
    if dtype_arg and dtype_arg.lower() != "auto":
        return dtype_arg.lower()
    return "bfloat16" if shape.dtype in ("float32", "float") else shape.dtype


def _fp8(value: object) -> bool:
    return isinstance(value, str) and value.lower().startswith("fp8")


def kv_cache_dtype(
    kv_arg: str | None,
    hf_quant_config: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    serve_dtype: str,
) -> tuple[str, int, str]:
    """(dtype, bytes per element, where it came from) of the KV cache."""
    arg = (kv_arg or "auto").lower()
    if arg != "auto":
        return arg, DTYPE_BYTES.get(arg, 2), "--kv-cache-dtype"
    quant = (hf_quant_config or {}).get("quantization")
    if isinstance(quant, Mapping) and _fp8(quant.get("kv_cache_quant_algo")):
        return "fp8", 1, "hf_quant_config.json kv_cache_quant_algo"
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping):
        scheme = qc.get("kv_cache_scheme")
        if _fp8(qc.get("kv_cache_quant_algo")) or (
            isinstance(scheme, Mapping) and scheme.get("type") == "float" and scheme.get("num_bits") == 8
        ):
            return "fp8", 1, "config.json quantization_config"
    return serve_dtype, DTYPE_BYTES.get(serve_dtype, 2), "model dtype"


def ssm_dtype(arg: str | None, shape: ModelShape, serve_dtype: str) -> str:
    """--mamba-ssm-cache-dtype, else the config's, else float32 for NemotronH, else the model dtype."""
    if arg and arg.lower() != "auto":
        return arg.lower()
    if shape.mamba and shape.mamba.ssm_dtype:
        return str(shape.mamba.ssm_dtype)
    return "float32" if shape.model_type.startswith("nemotron_h") else serve_dtype
