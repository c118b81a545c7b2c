"""Memory math on the real config.json files, checked against the hand calculation of vllm-facts.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconcile.preflight.memory import memory_table
from reconcile.vllm import memory
from reconcile.vllm.memory import GiB, estimate, kv_bytes_per_token, kv_cache_dtype, mamba_bytes_per_seq
from reconcile.vllm.shape import ShapeError, model_shape

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"


def load(name: str, file: str = "config.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / file).read_text())
    return data


@pytest.fixture
def nemotron() -> dict[str, Any]:
    return load("nemotron-h-nano")


@pytest.fixture
def llama() -> dict[str, Any]:
    return load("llama-3.1-8b")


def test_nemotron_has_6_attention_and_23_mamba_layers_of_52(nemotron: dict[str, Any]) -> None:
    s = model_shape(nemotron)
    assert (s.layers, s.attention_layers, s.layer_source) == (52, 6, "hybrid_override_pattern")
    assert s.mamba is not None and s.mamba.layers == 23
    # head_dim is 128 from the config, not hidden_size / heads = 84.
    assert (s.num_kv_heads, s.head_dim) == (2, 128)


def test_layers_block_type_lists_give_the_same_split(nemotron: dict[str, Any]) -> None:
    names = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
    listed = {k: v for k, v in nemotron.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[ch] for ch in nemotron["hybrid_override_pattern"]]
    s = model_shape(listed)
    assert (s.attention_layers, s.mamba.layers if s.mamba else 0, s.layer_source) == (
        6,
        23,
        "layers_block_type",
    )


def test_nemotron_at_tp2_holds_one_kv_head_per_gpu(nemotron: dict[str, Any]) -> None:
    s = model_shape(nemotron)
    # vllm-facts.md: 2 x 1 x 128 x 2 B x 6 = 3,072 B per token per GPU in bf16, 1,536 in fp8.
    assert kv_bytes_per_token(s, tp=2, dtype_bytes=2) == 3072
    assert kv_bytes_per_token(s, tp=2, dtype_bytes=1) == 1536
    assert kv_bytes_per_token(s, tp=2, dtype_bytes=1) * 1048576 == int(1.5 * GiB)
    assert kv_bytes_per_token(s, tp=1, dtype_bytes=1) == 3072
    assert kv_bytes_per_token(s, tp=4, dtype_bytes=1) == 1536  # max(1, 2 // 4): replicated, not 0


def test_llama_3_1_8b_kv_is_128_kib_per_token(llama: dict[str, Any]) -> None:
    s = model_shape(llama)
    assert s.attention_layers == 32 and s.mamba is None
    assert kv_bytes_per_token(s, tp=1, dtype_bytes=2) == 2 * 8 * 128 * 2 * 32 == 131072
    assert kv_bytes_per_token(s, tp=8, dtype_bytes=2) == 16384


def test_head_dim_falls_back_to_hidden_over_heads(llama: dict[str, Any]) -> None:
    without = {k: v for k, v in llama.items() if k != "head_dim"}
    assert model_shape(without).head_dim == 4096 // 32


def test_mamba_state_per_sequence_matches_the_formula(nemotron: dict[str, Any]) -> None:
    s = model_shape(nemotron)
    inner = 64 * 64
    conv = (4 - 1) * (inner + 2 * 8 * 128) // 2  # elements per GPU, model dtype (2 B)
    ssm = (64 // 2) * 64 * 128  # elements per GPU, fp32 (4 B)
    per_layer = conv * 2 + ssm * 4
    assert per_layer == 1_067_008
    assert mamba_bytes_per_seq(s, tp=2, conv_bytes=2, ssm_bytes=4) == 23 * per_layer


def test_kv_dtype_comes_from_flag_or_the_models_quant_config(nemotron: dict[str, Any]) -> None:
    quant = load("nemotron-h-nano", "hf_quant_config.json")
    assert kv_cache_dtype(None, quant, nemotron, "bfloat16") == (
        "fp8",
        1,
        "hf_quant_config.json kv_cache_quant_algo",
    )
    assert kv_cache_dtype("auto", None, nemotron, "bfloat16") == ("bfloat16", 2, "model dtype")
    assert kv_cache_dtype("fp8_e5m2", None, nemotron, "bfloat16")[1] == 1
    scheme = {**nemotron, "quantization_config": {"kv_cache_scheme": {"type": "float", "num_bits": 8}}}
    assert kv_cache_dtype(None, None, scheme, "bfloat16")[0] == "fp8"


def test_weights_count_safetensors_once() -> None:
    files = {"model-00001-of-00002.safetensors": 10, "model-00002-of-00002.safetensors": 5,
             "consolidated.safetensors": 15, "tokenizer.json": 3, "training_args.bin": 1}  # fmt: skip
    assert memory.weight_files(files) == {
        "model-00001-of-00002.safetensors": 10,
        "model-00002-of-00002.safetensors": 5,
    }
    assert memory.weight_files({"pytorch_model.bin": 7, "training_args.bin": 1}) == {"pytorch_model.bin": 7}


def test_vllm_batch_defaults_depend_on_the_gpu() -> None:
    assert memory.default_batch(int(139.8 * GiB), "NVIDIA H200") == (8192, 1024)
    assert memory.default_batch(80 * GiB, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert memory.default_batch(int(31.36 * GiB), "NVIDIA GeForce RTX 5090") == (2048, 256)


def test_overhead_estimate_matches_vllms_profile_of_llama_8b(llama: dict[str, Any]) -> None:
    # vLLM's profile of Llama-3.1-8B at 8,192 batched tokens: activation peak 1.19 GiB.
    o = memory.overhead(model_shape(llama), tp=1, batched_tokens=8192, max_num_seqs=256, eager=True)
    assert 1.0 * GiB < o.activation < 1.3 * GiB
    assert o.cuda_graphs == 0


def test_available_cache_matches_vllms_own_profile_of_llama_8b_on_h100(llama: dict[str, Any]) -> None:
    # vLLM's log: "total_gpu_memory (79.14GiB) x gpu_memory_utilization (0.90) = 71.22GiB; model weights
    # take 14.99GiB; non_torch_memory takes 0.12GiB; PyTorch activation peak memory takes 1.19GiB; the
    # rest of the memory reserved for KV Cache is 54.93GiB." (V0: no CUDA graphs in the profile.)
    weights = {"model.safetensors": int(14.99 * GiB)}
    args = {"max-num-seqs": 256, "max-num-batched-tokens": 8192, "enforce-eager": True}
    e = estimate(llama, None, weights, tp=1, total_bytes=int(79.14 * GiB), gpu="NVIDIA H100 80GB HBM3",
                 utilization=0.9, max_model_len=131072, args=args)  # fmt: skip
    assert abs(e.available_for_cache - 54.93 * GiB) < 0.02 * 54.93 * GiB


def _reference(nemotron: dict[str, Any], **args: Any) -> memory.MemoryEstimate:
    files = {f"model-0000{i}-of-00005.safetensors": 3_900_000_000 for i in range(1, 6)}
    return estimate(
        nemotron, load("nemotron-h-nano", "hf_quant_config.json"), files, tp=2, total_bytes=int(31.36 * GiB),
        gpu="NVIDIA GeForce RTX 5090", utilization=0.9, max_model_len=1048576,
        args={"max-num-seqs": 16, **args},
    )  # fmt: skip


# vLLM's block layout of the reference deployment (TP 2, fp8 KV): one Mamba layer's state per GPU is
# conv 3 x (4096 + 2 x 8 x 128) / 2 = 9,216 bf16 + ssm 32 x 64 x 128 = 262,144 fp32 = 1,067,008 B;
# an attention token is 1 head x 128 x 2 (K+V) x 1 B = 256 B, so the attention block becomes
# 16 x ceil(1,067,008 / (16 x 256)) = 16 x 261 = 4,176 tokens, page 4,176 x 256 = 1,069,056 B (the
# Mamba page is padded to it). Groups: 6 attention layers (group size 6) and 23 Mamba layers in
# ceil(23 / 6) = 4 groups. One request of 1,048,576 tokens: ceil(1,048,576 / 4,176) = 252 blocks
# + 1 block in each of the 4 Mamba groups (vLLM 0.26 leaves prefix caching off for hybrid models, so
# Mamba keeps one state a request: "none" mode; the H200 serve of a tiny NemotronH confirmed it, see
# tests/test_engine_oracle_figures.py) = 256 blocks x 6 layers x 1,069,056 B.
REFERENCE_ONE_REQUEST = 6 * 1_069_056 * (252 + 4)


def test_reference_deployment_fits_with_the_articles_numbers(nemotron: dict[str, Any]) -> None:
    e = _reference(nemotron)
    assert (e.kv_dtype, e.kv_per_token) == ("fp8", 1536)  # the article's 2 x 1 x 128 x 1 B x 6
    assert e.kv_at_max_len == REFERENCE_ONE_REQUEST == 1_642_070_016  # ~1.5 GiB + blocks and Mamba
    assert e.budget == int(0.9 * 31.36 * GiB)  # the article's "(0.9, 28.22 GiB)"
    assert e.weights_per_gpu == 5 * 3_900_000_000 // 2
    assert e.fits and e.headroom > 10 * GiB
    assert e.kv_capacity_tokens > 1048576
    table = memory_table(e)
    assert "2 (K+V) x 1 KV head/GPU (of 2) x 128 head_dim x 1 B (fp8) x 6 attention layers" in table
    assert "= 1,536 B" in table and "= 1.53 GiB" in table and "x 16 max-num-seqs" in table


def test_bf16_kv_doubles_the_cache(nemotron: dict[str, Any]) -> None:
    e = _reference(nemotron, **{"kv-cache-dtype": "bfloat16"})
    # 512 B a token: block 16 x ceil(1,067,008 / 8,192) = 2,096 tokens, page 1,073,152 B;
    # ceil(1,048,576 / 2,096) = 501 blocks + 4 Mamba blocks, x 6 layers.
    assert (e.kv_per_token, e.kv_at_max_len) == (3072, 6 * 1_073_152 * (501 + 4))


def test_a_request_longer_than_the_cache_does_not_fit(llama: dict[str, Any]) -> None:
    files = {f"model-0000{i}-of-00004.safetensors": 4_000_000_000 for i in range(1, 5)}
    e = estimate(llama, None, files, tp=1, total_bytes=24 * GiB, gpu="NVIDIA GeForce RTX 4090",
                 utilization=0.9, max_model_len=131072, args={})  # fmt: skip
    assert e.kv_at_max_len == 16 * GiB
    assert not e.fits
    assert 0 < e.max_len_that_fits < 131072


def test_a_config_without_layer_count_is_a_shape_error() -> None:
    with pytest.raises(ShapeError, match="num_hidden_layers"):
        model_shape({"hidden_size": 64, "num_attention_heads": 4})
