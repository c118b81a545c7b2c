"""Preflight rules for what the GPU's compute capability allows: the model dtype, the quantization
method, and an fp8 KV cache, with vLLM 0.26's own thresholds (each cited where it is set).

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, capability, finding, model_config
from reconcile.vllm.limits import text_config
from reconcile.vllm.memory import kv_cache_dtype

# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (checked by _check_valid_dtype): float16 is
# refused for these model types, "Numerical instability. Please use bfloat16 or float32 instead."
FLOAT16_REFUSED = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})
_HALF = {
    "half": "float16",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}
_HALF.update({"float": "float32", "float32": "float32", "fp32": "float32"})

# Each method's get_min_capability() in vllm/model_executor/layers/quantization/ (vLLM 0.26), which
# VllmConfig._get_quantization_config (vllm/config/vllm.py) compares with the GPU's: "The quantization
# method X is not supported for the current GPU. Minimum capability: N. Current capability: M."
MIN_CAPABILITY: Mapping[str, int] = {
    "awq": 75, "awq_marlin": 75, "auto_awq": 75,  # auto_awq.py AutoAWQConfig
    "gptq": 60, "gptq_marlin": 60, "auto_gptq": 60,  # auto_gptq.py AutoGPTQConfig
    "fp8": 75,  # fp8.py Fp8Config (below sm_89 through the weight-only FP8 Marlin kernel)
    "fbgemm_fp8": 80,  # fbgemm_fp8.py
    "fp_quant": 100,  # fp_quant.py
    "modelopt": 89,  # modelopt.py ModelOptFp8Config
    "modelopt_fp4": 75,  # modelopt.py ModelOptNvFp4Config (below sm_100 through FP4 Marlin)
    "modelopt_mxfp8": 80, "mxfp8": 80,  # modelopt.py ModelOptMxFp8Config
    "modelopt_mixed": 75,  # modelopt.py ModelOptMixedPrecisionConfig
    "compressed-tensors": 70,  # compressed_tensors/compressed_tensors.py CompressedTensorsConfig
    "bitsandbytes": 70, "experts_int8": 80, "moe_wna16": 70, "torchao": 75, "humming": 75,
    "mxfp4": 80, "gpt_oss_mxfp4": 80,  # mxfp4.py Mxfp4Config, GptOssMxfp4Config
    "quark": 70, "inc": 60,  # quark/quark.py, inc/inc.py
}  # fmt: skip
# get_supported_act_dtypes() of the methods that take bfloat16 only (mxfp4.py, modelopt.py MxFp8,
# fp_quant.py); the same VllmConfig check fails "float16 is not supported for quantization method X".
BF16_ONLY = frozenset({"mxfp4", "gpt_oss_mxfp4", "modelopt_mxfp8", "mxfp8", "fp_quant"})
# Native FP4 GEMMs (cutlass_scaled_mm_supports_fp4, nvfp4_utils.py) need sm_100 or newer; below it
# vllm/model_executor/kernels/linear/nvfp4/marlin.py MarlinNvFp4LinearKernel warns "Your GPU does not
# have native support for FP4 computation ... Weight-only FP4 compression will be used".
NATIVE_FP4 = 100
NATIVE_FP8 = 89  # vllm/platforms/cuda.py CudaPlatform.supports_fp8: has_device_capability(89)
BF16_CAPABILITY = 80  # vllm/platforms/cuda.py CudaPlatform.check_if_supports_dtype


def _config_dtype(config: Mapping[str, Any]) -> str:
    # ModelArchConfigConvertorBase.get_torch_dtype: the config's dtype, float32 when it has none.
    raw = (
        text_config(config).get("torch_dtype")
        or text_config(config).get("dtype")
        or config.get("torch_dtype")
    )
    return _HALF.get(str(raw).lower(), "float32") if raw else "float32"


def serve_dtype(c: RuleContext, config: Mapping[str, Any], cc: int | None) -> tuple[str, str]:
    """(dtype vLLM runs in, why), as vllm/config/model.py _get_and_verify_dtype resolves `--dtype`."""
    raw = c.args.get("dtype")
    arg = str(raw).lower() if isinstance(raw, str) else "auto"
    if arg != "auto":
        return _HALF.get(arg, arg), f"{c.arg('dtype')}"
    model_type = str(config.get("model_type", ""))
    want = _config_dtype(config)
    # _resolve_auto_dtype: the platform's dtypes (CudaPlatform.supported_dtypes: bf16 from sm_80) less
    # float16 for the refused models; float32 checkpoints run in the first of them.
    dtypes = (
        ["bfloat16", "float16", "float32"] if cc is None or cc >= BF16_CAPABILITY else ["float16", "float32"]
    )
    dtypes = [d for d in dtypes if not (d == "float16" and model_type in FLOAT16_REFUSED)]
    if want == "float32":
        return dtypes[0], "auto: float32 checkpoint served in " + dtypes[0]
    if want in dtypes:
        return want, f"auto: config.json {want}"
    return dtypes[0], f"auto: config.json {want} is not supported there; vLLM falls back to {dtypes[0]}"


def _dtype(c: RuleContext) -> list[Finding]:
    rule, config = "hardware.dtype", model_config(c)
    if config is None:
        return []
    found = capability(c)
    cc, gpu = found if found else (None, "")
    dtype, why = serve_dtype(c, config, cc)
    model_type = str(config.get("model_type", ""))
    if dtype == "float16" and model_type in FLOAT16_REFUSED:
        msg = (
            f"{why} = float16, which vLLM refuses for {model_type}: \"The model type '{model_type}' does "
            'not support float16. Reason: Numerical instability."'
        )
        other = "bfloat16" if cc is None or cc >= BF16_CAPABILITY else "float32"
        return [finding(rule, "error", msg, f'set {c.arg("dtype")} = "{other}"', dtype=dtype)]
    if cc is None:
        return []  # no GPU probed nor declared (a CPU-only spec): nothing to compare with
    if dtype == "bfloat16" and cc < BF16_CAPABILITY:
        msg = (
            f'{why} = bfloat16 on {gpu}: vLLM fails with "Bfloat16 is only supported on GPUs with compute '
            'capability of at least 8.0"'
        )
        other = "float32" if model_type in FLOAT16_REFUSED else "half"
        return [finding(rule, "error", msg, f'set {c.arg("dtype")} = "{other}"', dtype=dtype)]
    if "falls back" in why:
        grows = " (float32 doubles the weights' memory)" if dtype == "float32" else ""
        msg = f"dtype {why} on {gpu}{grows}"
        return [finding(rule, "warning", msg, f'set {c.arg("dtype")} = "{dtype}" to say so', dtype=dtype)]
    return [finding(rule, "info", f"dtype {dtype} ({why}) runs on {gpu}", dtype=dtype)]


def quant_method(c: RuleContext, config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(vLLM's quantization method, its algorithm) as ModelConfig._verify_quantization picks it, from
    config.json's quantization_config, else hf_quant_config.json (ModelOpt <= 0.29), else --quantization."""
    qc = config.get("quantization_config") or config.get("compression_config") or c.inputs.hf_quant_config
    if isinstance(qc, Mapping):
        method = str(qc.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
        inner = qc.get("quantization")
        algo = str((inner if isinstance(inner, Mapping) else qc).get("quant_algo", "")).upper()
        producer = qc.get("producer")
        if method.startswith("modelopt") or (
            isinstance(producer, Mapping) and producer.get("name") == "modelopt"
        ):
            # model_arch_config_convertor.py _normalize_quantization_config and ModelOpt*Config
            # .override_quantization_method: the algorithm picks the config class.
            modelopt = {"NVFP4": "modelopt_fp4", "W4A16_NVFP4": "modelopt_fp4", "MXFP8": "modelopt_mxfp8"}
            method = modelopt.get(algo, "modelopt_mixed" if algo == "MIXED_PRECISION" else "modelopt")
        elif method == "compressed-tensors":
            algo = str(qc.get("format", "")).upper()
        elif method == "mxfp4" and str(config.get("model_type")) == "gpt_oss":
            method = "gpt_oss_mxfp4"
        if method:
            return method, algo
    arg = c.args.get("quantization")
    return (str(arg).lower(), "") if isinstance(arg, str) else None


def _quantization(c: RuleContext) -> list[Finding]:
    rule, config = "hardware.quantization", model_config(c)
    if config is None:
        return []
    q = quant_method(c, config)
    if q is None:
        return []
    method, algo = q
    found = capability(c)
    cc, gpu = found if found else (None, "")
    dtype, _ = serve_dtype(c, config, cc)
    shown = f"{method}{f' ({algo})' if algo else ''}"
    if method in BF16_ONLY and dtype != "bfloat16":
        msg = f'{shown} runs in bfloat16 only; vLLM fails: "{dtype} is not supported for quantization method"'
        return [finding(rule, "error", msg, f'set {c.arg("dtype")} = "bfloat16"', method=method)]
    least = MIN_CAPABILITY.get(method)
    if cc is None:
        return []
    if least is None:
        return [finding(rule, "info", f"quantization {shown}: no minimum known for it, not checked")]
    if cc < least:
        msg = (
            f'quantization {shown} needs compute capability {least / 10:.1f}; {gpu}. vLLM: "The quantization '
            f'method {method} is not supported for the current GPU. Minimum capability: {least}."'
        )
        return [finding(rule, "error", msg, "use a checkpoint quantized for this GPU (or its bf16 original)")]
    nvfp4 = algo == "NVFP4" or algo.startswith("NVFP4-PACK")  # W4A16_NVFP4 is weight-only by design
    if nvfp4 and cc < NATIVE_FP4:
        msg = (
            f"quantization {shown} on {gpu}: no native FP4 below sm_100, so vLLM runs the weights through "
            "its slower weight-only FP4 Marlin kernel (compute-heavy batches slow down)"
        )
        return [finding(rule, "warning", msg, "expected on this GPU; an FP8 or bf16 checkpoint is faster")]
    fp8 = method == "fp8" or algo.startswith(("FP8", "FLOAT-QUANTIZED"))
    if fp8 and cc < NATIVE_FP8:
        msg = f"quantization {shown} on {gpu}: no native FP8 below sm_89; vLLM uses weight-only FP8 Marlin"
        return [finding(rule, "warning", msg, "expected on this GPU; it saves memory, not compute")]
    return [finding(rule, "info", f"quantization {shown} runs on {gpu}", method=method)]


def _kv_cache(c: RuleContext) -> list[Finding]:
    rule, config = "hardware.kv-cache-dtype", model_config(c)
    found = capability(c)
    if config is None or found is None:
        return []
    cc, gpu = found
    raw = c.args.get("kv-cache-dtype")
    kv, _, source = kv_cache_dtype(
        raw if isinstance(raw, str) else None, c.inputs.hf_quant_config, config, "auto"
    )
    if not kv.startswith("fp8"):
        return []
    if cc >= NATIVE_FP8:
        return [finding(rule, "info", f"fp8 KV cache ({source}) on {gpu}")]
    # vllm/v1/attention/backends/triton_attn.py TritonAttentionImpl.__init__ (and triton_mla.py):
    # "FP8 KV cache is not supported by the Triton attention backend ... requires SM89+". FlashInfer
    # (flashinfer.py supports_compute_capability: sm_80 and up) stores fp8 KV in software.
    other = "bfloat16" if cc >= BF16_CAPABILITY else "float16"
    fix = f'set {c.arg("kv-cache-dtype")} = "{other}"'
    dists = c.inputs.venv_distributions
    # MLA below sm_89 has no escape: FlashInfer's MLA backend needs sm_100, FlashMLA and FlashAttention
    # MLA sm_90 (vllm/platforms/cuda.py _get_backend_priorities), and Triton MLA refuses fp8 there.
    mla = isinstance(text_config(config).get("kv_lora_rank"), int)
    if not mla and cc >= BF16_CAPABILITY and dists is not None and "flashinfer-python" in dists:
        msg = f"fp8 KV cache ({source}) on {gpu}: only FlashInfer's attention serves it below sm_89"
        return [finding(rule, "warning", msg, f"keep flashinfer-python in the venv, or {fix}")]
    msg = (
        f'fp8 KV cache ({source}) on {gpu}: vLLM fails with "FP8 KV cache is not supported by the Triton '
        'attention backend ... native FP8 (fp8e4nv) requires SM89+"'
    )
    if cc >= BF16_CAPABILITY and not mla:
        fix += ", or add flashinfer-python to [venv] packages (FlashInfer serves fp8 KV from sm_80)"
    return [finding(rule, "error", msg, fix)]


RULES = (_dtype, _quantization, _kv_cache)
