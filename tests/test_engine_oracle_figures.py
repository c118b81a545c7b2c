"""The engine against vLLM 0.26.0 on the H200 lab (issue 14): the figures the oracle and real
`vllm serve` logged (tools/preflight_oracle.sh, run 2026-12-01), so CI keeps them.

Oracle (a), preflight-oracle.md, "tp1.one_request_bytes: vLLM N": what vLLM's
_max_memory_usage_bytes_from_groups says one request of max_model_len needs. A sliding layer keeps
window - 1 + max_in_flight_tokens tokens (+1 block), and with async scheduling (vLLM's default) two
batches of 8,192 are in flight. Serve (b), preflight-serve.md: "GPU KV cache size: N tokens" is
max concurrency x max_model_len (get_kv_cache_capacity), and a hybrid model's prefix caching is off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconcile.vllm.kvgroups import kv_layout
from reconcile.vllm.kvspec import layer_specs
from reconcile.vllm.limits import derive_max_model_len
from reconcile.vllm.memory import GiB, MemoryEstimate, estimate
from reconcile.vllm.servedefaults import in_flight_tokens, mamba_cache_mode, v2_runner
from reconcile.vllm.shape import model_shape

CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"
BATCHED = 8192  # vLLM's max_num_batched_tokens on an H200 (the oracle logged it)


@pytest.mark.parametrize(
    ("name", "tp", "vllm_bytes"),
    [
        # preflight-oracle.md: "gemma-3-4b-it: tp1.one_request_bytes: vLLM 4825415680 reconcile 3818782720"
        ("gemma-3-4b-it", 1, 4_825_415_680),
        # "gpt-oss-20b: tp1.one_request_bytes: vLLM 3627417600 reconcile 3426091008"
        ("gpt-oss-20b", 1, 3_627_417_600),
        # "gpt-oss-120b: tp1.one_request_bytes: vLLM 5441126400 ...; tp.one_request_bytes: vLLM 2720563200"
        ("gpt-oss-120b", 1, 5_441_126_400),
        ("gpt-oss-120b", 2, 2_720_563_200),
        # "mixtral-8x7b-v0.1: tp1.one_request_bytes: vLLM 2686451712 ...; tp.one_request_bytes: vLLM
        # 1343225856"
        ("mixtral-8x7b-v0.1", 1, 2_686_451_712),
        ("mixtral-8x7b-v0.1", 2, 1_343_225_856),
    ],
)
def test_one_request_of_a_sliding_window_model_is_what_vllm_needs(
    name: str, tp: int, vllm_bytes: int
) -> None:
    cfg = json.loads((CORPUS / f"{name}.json").read_text())["config"]
    length = derive_max_model_len(cfg, "0.26.0").default
    shape = model_shape(cfg)
    in_flight = in_flight_tokens(BATCHED, 1, True, v2_runner(cfg, shape))
    assert in_flight == 2 * BATCHED
    layout = kv_layout(layer_specs(cfg, tp=tp, max_model_len=length))
    assert layout.one_request_bytes(length, in_flight) == vllm_bytes


def test_mixtral_keeps_its_window_plus_two_batches_a_layer() -> None:
    # 32 layers x 16 tokens x 8 KV heads x 128 x 2 (K+V) x 2 B = 2 MiB a block at TP 1;
    # ceil((4,095 + 16,384) / 16) + 1 = 1,281 blocks; 1,281 x 2 MiB = the oracle's 2,686,451,712 B.
    cfg = json.loads((CORPUS / "mixtral-8x7b-v0.1.json").read_text())["config"]
    layout = kv_layout(layer_specs(cfg, tp=1, max_model_len=32768))
    assert layout.block_bytes == 2 * 1024**2
    assert layout.one_request_bytes(32768, 2 * BATCHED) == 1281 * layout.block_bytes == 2_686_451_712


def test_in_flight_batches_follow_vllms_concurrent_batches() -> None:
    assert in_flight_tokens(8192, 1, True, False) == 16384  # async scheduling: two steps overlap
    assert in_flight_tokens(8192, 1, False, True) == 8192  # --no-async-scheduling
    assert in_flight_tokens(2048, 4, True, True) == 5 * 2048  # PP 4, V2 runner: one more than stages
    assert in_flight_tokens(2048, 4, True, False) == 4 * 2048  # PP 4, V1 runner (MoE or hybrid)


COMMON = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "torch_dtype": "bfloat16"}
ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


# The tiny models tools/preflight_serve_check.py served, as their config.json reads (model_type and
# architectures as transformers writes them).
def _tiny(model_type: str, arch: str, **kw: Any) -> dict[str, Any]:
    return {**COMMON, "model_type": model_type, "architectures": [arch], **kw}


SLIDING_FITS = {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 512}
SERVED: dict[str, dict[str, Any]] = {
    "dense": _tiny("llama", "LlamaForCausalLM", num_hidden_layers=4, **ATTN, max_position_embeddings=4096),
    "sliding": _tiny("mistral", "MistralForCausalLM", num_hidden_layers=4, **ATTN, sliding_window=512,
                     max_position_embeddings=8192),
    "interleaved": _tiny("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=6,
                         **{**ATTN, "head_dim": 128}, sliding_window=256, max_position_embeddings=8192,
                         layer_types=["sliding_attention", "full_attention"] * 3),
    "mamba-hybrid": _tiny("nemotron_h", "NemotronHForCausalLM", num_hidden_layers=4, **ATTN,
                          layers_block_type=["mamba", "attention", "mamba", "mlp"], mamba_num_heads=8,
                          mamba_head_dim=32, n_groups=1, ssm_state_size=64, conv_kernel=4, expand=1,
                          max_position_embeddings=8192),
    "sliding-fits": _tiny("mistral", "MistralForCausalLM", num_hidden_layers=8, **SLIDING_FITS,
                          max_position_embeddings=1048576),
}  # fmt: skip


def _served(name: str) -> MemoryEstimate:
    cfg = SERVED[name]
    length = derive_max_model_len(cfg, "0.26.0").default
    return estimate(cfg, None, {}, tp=1, total_bytes=150_109_880_320, gpu="NVIDIA H200", utilization=0.1,
                    max_model_len=length, args={"enforce-eager": True})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "available_gib", "logged_tokens"),
    [
        # preflight-serve.md rows: "| dense | 4,096 | ... | 7174176 | ... | 13.68 / 13.65 |" and so on
        # ("Available KV cache memory: X GiB" logged to 0.01 GiB, then "GPU KV cache size: N tokens").
        ("dense", 13.68, 7_174_176),
        ("sliding", 13.68, 7_159_935),
        ("interleaved", 13.63, 2_380_163),
        ("mamba-hybrid", 13.45, 27_197_440),
        ("sliding-fits", 13.37, 27_163_772),
    ],
)
def test_logged_kv_cache_size_is_concurrency_times_length(
    name: str, available_gib: float, logged_tokens: int
) -> None:
    """Some block count inside the logged memory (rounded to 0.01 GiB) gives exactly vLLM's figure."""
    e = _served(name)
    assert e.layout is not None and e.max_model_len
    low, high = int((available_gib - 0.005) * GiB), int((available_gib + 0.005) * GiB)
    block = e.layout.block_bytes
    counts = range(low // block, high // block + 1)
    got = {
        e.layout.capacity_tokens(n * block, e.max_model_len, e.in_flight_tokens, e.mamba_mode) for n in counts
    }
    assert logged_tokens in got


def test_sliding_window_at_a_million_tokens_counts_concurrency_not_blocks() -> None:
    # sliding-fits: 8 layers x 16 x 8 heads x 128 x 2 x 2 B = 512 KiB a block; one request keeps
    # ceil((511 + 16,384) / 16) + 1 = 1,057 blocks, so 27,382 blocks are 25.9 requests of 1,048,576
    # tokens: vLLM logged "GPU KV cache size: 27,163,772 tokens" (the blocks hold 438,112).
    e = _served("sliding-fits")
    assert e.layout is not None
    assert e.layout.block_bytes == 512 * 1024
    assert e.layout.blocks_per_request(1048576, e.in_flight_tokens) == 1057
    assert e.layout.capacity_tokens(27382 * 512 * 1024, 1048576, e.in_flight_tokens) == 27_163_772


def test_a_hybrid_keeps_one_mamba_state_a_request_by_default() -> None:
    # mamba-hybrid: vLLM 0.26 leaves prefix caching off for hybrid models (mamba_cache_mode "none").
    # NemotronH's SSM state is fp32: 3 x 384 x 2 + 8 x 32 x 64 x 4 = 67,840 B, so the attention block is
    # 16 x ceil(67,840 / (16 x 512)) = 144 tokens; one request takes 1 + 1 Mamba blocks + ceil(8,192 /
    # 144) = 57 attention blocks = 59, and 13.45 GiB / (144 x 512 B) / 59 x 8,192 = vLLM's 27,197,440.
    e = _served("mamba-hybrid")
    assert e.layout is not None and e.mamba_mode == "none"
    assert (e.layout.min_block_size, e.layout.page_bytes) == (144, 144 * 512)
    assert e.layout.blocks_per_request(8192, e.in_flight_tokens, e.mamba_mode) == 59
    cfg = SERVED["mamba-hybrid"]
    shape = model_shape(cfg)
    assert mamba_cache_mode(cfg, shape, {"enable-prefix-caching": True}) == "all"  # NemotronH supports it
    assert (
        mamba_cache_mode(cfg, shape, {"enable-prefix-caching": True, "mamba-cache-mode": "align"}) == "align"
    )
    qwen35 = json.loads((CORPUS / "qwen3.5-9b.json").read_text())["config"]
    assert mamba_cache_mode(qwen35, model_shape(qwen35), {"enable-prefix-caching": True}) == "align"


def test_mla_budget_counts_the_prefill_workspace_vllm_profiles() -> None:
    # preflight-serve.md: "| mla | 4,096 | True | True | 6093168 | 6,357,824 | 4.34% | 6091008 |
    # 13.07 / 13.64 |"
    # vLLM's profile run allocates min(max(8 x 4,096, 4 x 1,024 seqs x 64), 65,536) = 65,536 rows x 16
    # heads x (128 + 128) x 2 B for MLA: 0.50 GiB that a dense model of this size does not have.
    mla = {"kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
           "v_head_dim": 128, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
           "moe_intermediate_size": 128, "first_k_dense_replace": 1}  # fmt: skip
    cfg = _tiny("deepseek_v2", "DeepseekV2ForCausalLM", num_hidden_layers=2, num_attention_heads=16,
                num_key_value_heads=16, max_position_embeddings=4096, **mla)  # fmt: skip
    e = estimate(cfg, None, {}, tp=1, total_bytes=150_109_880_320, gpu="NVIDIA H200", utilization=0.1,
                 max_model_len=4096, args={"enforce-eager": True})  # fmt: skip
    assert e.overhead.mla_workspace == 65536 * 16 * 256 * 2 == GiB // 2
    assert abs(e.available_for_cache / GiB - 13.07) < 0.1  # was 13.64 without it
    assert abs(e.kv_capacity_tokens - 6_093_168) < 0.01 * 6_093_168  # +4.34% before, +0.64% now


def test_a_million_positions_pay_for_the_rope_cache() -> None:
    # preflight-serve.md: dense-nofit and sliding-fits (1,048,576 positions) both logged 13.37 GiB
    # available against 13.68 for the same kind of model at 4,096-8,192: the cos/sin cache.
    e = _served("sliding-fits")
    assert e.overhead.rope_cache == 1048576 * 128 * 2
    assert abs(e.available_for_cache / GiB - 13.37) < 0.05  # 13.64 predicted before
    assert _served("mamba-hybrid").overhead.rope_cache == 0  # NemotronH attention has no rotary embedding


def test_a_hybrid_budget_counts_the_mamba2_profile_peak() -> None:
    # preflight-serve.md: mamba-hybrid logged 13.45 GiB available where the plan said 13.66 (+1.53%).
    # Its SSD kernels are autotuned in the profile run (Triton's 256 MiB L2 flush) while the layer
    # holds its input and residual, in_proj's 8,192 x (256 + 384 + 8) and ssm_output's 8,192 x 256
    # (bf16); n_groups 1 at TP 1 takes rms_norm_gated's Triton kernel (one bf16 output).
    e = _served("mamba-hybrid")
    t = 8192
    assert e.overhead.activation == 2 * t * 256 * 2 + t * (256 + 384 + 8) * 2 + t * 256 * 2 + 256 * 2**20
    assert abs(e.available_for_cache / GiB - 13.45) < 0.02  # no weight files here: 13.66 before
    assert abs(e.kv_capacity_tokens - 27_197_440) < 0.002 * 27_197_440
