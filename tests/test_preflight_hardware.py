"""What the GPU's compute capability allows (vLLM 0.26's thresholds): dtype, quantization method, fp8 KV
cache. Each rule with a failing and a passing case, on real config.json field values."""

from __future__ import annotations

from typing import Any

from reconcile.preflight.context import GpuFact
from reconcile.vllm.memory import GiB
from tests.test_preflight import findings, load, spec, the

NO_PARSER: dict[str, Any] = {"reasoning-parser": None, "reasoning-parser-plugin": None}
T4 = (GpuFact(0, "Tesla T4", "7.5", 15 * GiB, 15 * GiB),)
A100 = (GpuFact(0, "NVIDIA A100-SXM4-80GB", "8.0", 80 * GiB, 79 * GiB),)
L4 = (GpuFact(0, "NVIDIA L4", "8.9", 22 * GiB, 22 * GiB),)
H200 = (GpuFact(0, "NVIDIA H200", "9.0", int(139.8 * GiB), 139 * GiB),)
B200 = (GpuFact(0, "NVIDIA B200", "10.0", 180 * GiB, 179 * GiB),)
# Gemma-2 9B's config.json (the fields these rules read).
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "torch_dtype": "float32",
          "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
          "num_hidden_layers": 42, "vocab_size": 256000, "max_position_embeddings": 8192,
          "sliding_window": 4096}  # fmt: skip
# Qwen2.5-7B-Instruct-AWQ and -GPTQ-Int4, Llama-3.1-8B-Instruct-FP8 (config.json quantization_config).
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
MODELOPT_FP8 = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}  # fmt: skip


def one(s: Any, rule: str, **inputs: Any) -> Any:
    return the(findings(s, **inputs), rule)


def llama(**extra: Any) -> dict[str, Any]:
    return {**load("llama-3.1-8b"), **extra}


def test_bfloat16_needs_compute_capability_8() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, **NO_PARSER}})  # the reference asks dtype bfloat16
    common: dict[str, Any] = {"model_config": llama(), "hf_quant_config": None}
    f = one(s, "hardware.dtype", gpus=T4, **common)
    assert f.severity == "error" and "Bfloat16 is only supported on GPUs with compute capability" in f.message
    assert f.fix == 'set args.dtype = "half"'
    assert one(s, "hardware.dtype", gpus=A100, **common).severity == "info"


def test_auto_dtype_falls_back_on_old_gpus_as_vllm_does() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "dtype": None, **NO_PARSER}})
    f = one(s, "hardware.dtype", gpus=T4, model_config=llama(), hf_quant_config=None)
    assert f.severity == "warning" and "falls back to float16" in f.message
    # Gemma-2 refuses float16, so on a T4 vLLM picks float32: twice the weights.
    g = one(s, "hardware.dtype", gpus=T4, model_config=GEMMA2, hf_quant_config=None)
    assert g.severity == "info" and g.evidence["dtype"] == "float32"
    ok = one(s, "hardware.dtype", gpus=H200, model_config=llama(), hf_quant_config=None)
    assert ok.severity == "info" and ok.message.startswith("dtype bfloat16 (auto: config.json bfloat16)")


def test_float16_is_refused_for_gemma2_and_gemma3() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "dtype": "half", **NO_PARSER}})
    for model_type in ("gemma2", "gemma3", "gemma3_text"):
        config = {**GEMMA2, "model_type": model_type}
        f = one(s, "hardware.dtype", gpus=H200, model_config=config, hf_quant_config=None)
        assert f.severity == "error" and "does not support float16" in f.message, model_type
        assert f.fix == 'set args.dtype = "bfloat16"'
    assert one(s, "hardware.dtype", gpus=H200, model_config=llama(), hf_quant_config=None).severity == "info"


def test_quantization_methods_need_their_minimum_capability() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "dtype": "half", **NO_PARSER}})
    modelopt = one(s, "hardware.quantization", gpus=A100, model_config=llama(), hf_quant_config=MODELOPT_FP8)
    assert modelopt.severity == "error" and "Minimum capability: 89" in modelopt.message
    ok = one(s, "hardware.quantization", gpus=L4, model_config=llama(), hf_quant_config=MODELOPT_FP8)
    assert (
        ok.severity == "info"
        and ok.message == "quantization modelopt (FP8) runs on NVIDIA L4 (compute capability 8.9)"
    )
    awq = llama(quantization_config=AWQ)
    assert one(s, "hardware.quantization", gpus=T4, model_config=awq, hf_quant_config=None).severity == "info"
    pascal = (GpuFact(0, "Tesla P100-PCIE-16GB", "6.0", 16 * GiB, 16 * GiB),)
    f = one(s, "hardware.quantization", gpus=pascal, model_config=awq, hf_quant_config=None)
    assert f.severity == "error" and "needs compute capability 7.5" in f.message
    gptq = llama(quantization_config=GPTQ)
    assert (
        one(s, "hardware.quantization", gpus=pascal, model_config=gptq, hf_quant_config=None).severity
        == "info"
    )


def test_nvfp4_below_sm_100_is_a_warning_about_the_slower_path() -> None:
    nvfp4 = load("nemotron-h-nano", "hf_quant_config.json")
    s = spec(server={"args": {"tensor-parallel-size": 1}})
    f = one(s, "hardware.quantization", gpus=H200, hf_quant_config=nvfp4)
    assert f.severity == "warning" and "weight-only FP4 Marlin" in f.message
    assert one(s, "hardware.quantization", gpus=B200, hf_quant_config=nvfp4).severity == "info"
    assert one(spec(), "hardware.quantization").message.startswith(
        "quantization modelopt_fp4 (NVFP4) runs on"
    )


def test_fp8_weights_below_sm_89_are_weight_only_and_mxfp4_needs_bfloat16() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, **NO_PARSER}})
    fp8 = llama(quantization_config=FP8)
    assert (
        one(s, "hardware.quantization", gpus=A100, model_config=fp8, hf_quant_config=None).severity
        == "warning"
    )
    assert (
        one(s, "hardware.quantization", gpus=H200, model_config=fp8, hf_quant_config=None).severity == "info"
    )
    gpt_oss = {**llama(), "model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}
    half = spec(server={"args": {"tensor-parallel-size": 1, "dtype": "float16", **NO_PARSER}})
    f = one(half, "hardware.quantization", gpus=H200, model_config=gpt_oss, hf_quant_config=None)
    assert f.severity == "error" and "gpt_oss_mxfp4" in f.message and "bfloat16 only" in f.message
    assert (
        one(s, "hardware.quantization", gpus=H200, model_config=gpt_oss, hf_quant_config=None).severity
        == "info"
    )


def test_fp8_kv_cache_needs_sm_89_or_flashinfer() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "kv-cache-dtype": "fp8", **NO_PARSER}})
    common: dict[str, Any] = {"model_config": llama(), "hf_quant_config": None}
    f = one(s, "hardware.kv-cache-dtype", gpus=A100, **common)
    assert f.severity == "error" and "requires SM89+" in f.message
    assert f.fix.startswith('set args.kv-cache-dtype = "bfloat16"') and "flashinfer-python" in f.fix
    with_fi = one(
        s, "hardware.kv-cache-dtype", gpus=A100, venv_distributions={"flashinfer-python": "0.6.14"}, **common
    )
    assert with_fi.severity == "warning"
    turing = one(
        s, "hardware.kv-cache-dtype", gpus=T4, venv_distributions={"flashinfer-python": "0.6.14"}, **common
    )
    assert turing.severity == "error" and turing.fix == 'set args.kv-cache-dtype = "float16"'
    assert one(s, "hardware.kv-cache-dtype", gpus=L4, **common).severity == "info"
    # Latent attention (DeepSeek): no MLA backend stores fp8 below sm_89, FlashInfer or not.
    mla = {**llama(), "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    fi = {"flashinfer-python": "0.6.14"}
    f = one(
        s, "hardware.kv-cache-dtype", gpus=A100, model_config=mla, hf_quant_config=None, venv_distributions=fi
    )
    assert f.severity == "error" and "flashinfer" not in f.fix
    # The checkpoint's own fp8 KV (hf_quant_config.json kv_cache_quant_algo) counts the same.
    nvfp4 = load("nemotron-h-nano", "hf_quant_config.json")
    ckpt = one(
        spec(server={"args": {"tensor-parallel-size": 1}}),
        "hardware.kv-cache-dtype",
        gpus=A100,
        hf_quant_config=nvfp4,
    )
    assert ckpt.severity == "error" and "hf_quant_config.json" in ckpt.message


def test_without_a_known_compute_capability_nothing_is_guessed() -> None:
    s = spec(gpu={"compute_capability": None}, server={"args": {"kv-cache-dtype": "fp8"}})
    found = findings(s, gpus=None)
    assert not [f for f in found if f.rule.startswith("hardware.")]
    gemma = findings(spec(gpu={"compute_capability": None}, server={"args": {"dtype": "half"}}), gpus=None,
                     model_config=GEMMA2)  # fmt: skip
    assert the(gemma, "hardware.dtype").severity == "error"  # refused whatever the GPU
    spec_cc = the(findings(spec(), gpus=None), "hardware.dtype")
    assert spec_cc.message == "dtype bfloat16 (args.dtype) runs on [gpu] compute_capability 12.0"
