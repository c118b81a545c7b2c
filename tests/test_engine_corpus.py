"""The engine on 27 published config.json files (tests/data/model_configs): derived length, per-layer
KV-cache specs and KV bytes per token per GPU, each expected figure worked by hand from vLLM's rules.

vLLM's rules used below (vllm/v1/kv_cache_interface.py, vllm/config/model.py):
- attention page per token = 2 (K+V) x max(1, kv_heads // TP) x head_dim x dtype bytes; MLA keeps one
  latent of kv_lora_rank + qk_rope_head_dim per token, replicated on every GPU, no factor 2;
- derived length: the length keys' minimum, x factor for rope types other than llama3/longrope
  (yarn from original_max_position_embeddings); unset max-model-len of a LongRoPE model is
  original_max_position_embeddings; Gemma-3's length is not scaled again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from reconcile.vllm.families import resolve
from reconcile.vllm.kvgroups import kv_layout
from reconcile.vllm.kvspec import kinds_summary, layer_specs
from reconcile.vllm.limits import derive_max_model_len
from reconcile.vllm.memory import GiB, estimate

CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"
BF16 = 2


class Expect(NamedTuple):
    derived: int  # vLLM 0.26's derived max_model_len
    default: int  # what an unset max-model-len becomes
    kinds: dict[str, int]  # cache-holding layers on one GPU by kind
    kv_per_token: int  # KV bytes per token per GPU at the corpus's TP, bf16, all attention layers
    groups: int  # KV cache groups vLLM forms


def full(layers: int) -> dict[str, int]:
    return {"full": layers}


EXPECTED: dict[str, Expect] = {
    # Llama 3.x: rope llama3 is not scaled; 8 KV heads, head_dim 128.
    "llama-3.1-8b": Expect(131072, 131072, full(32), 2 * 8 * 128 * BF16 * 32, 1),
    "llama-3.2-3b": Expect(131072, 131072, full(28), 2 * 8 * 128 * BF16 * 28, 1),
    "llama-3.1-70b-instruct": Expect(131072, 131072, full(80), 2 * (8 // 4) * 128 * BF16 * 80, 1),  # TP 4
    # Qwen2.5: use_sliding_window false, so Qwen2Config sets sliding_window None: all full attention.
    # head_dim = hidden / heads: 3B 2048/16 = 128, 7B 3584/28 = 128, 14B/32B 5120/40 = 128.
    "qwen2.5-3b": Expect(32768, 32768, full(36), 2 * 2 * 128 * BF16 * 36, 1),
    "qwen2.5-7b": Expect(131072, 131072, full(28), 2 * 4 * 128 * BF16 * 28, 1),
    "qwen2.5-14b": Expect(131072, 131072, full(48), 2 * (8 // 2) * 128 * BF16 * 48, 1),  # TP 2
    "qwen2.5-32b": Expect(131072, 131072, full(64), 2 * (8 // 4) * 128 * BF16 * 64, 1),  # TP 4
    # Qwen3 dense and MoE: head_dim 128 explicit, max_position_embeddings 40960.
    "qwen3-4b": Expect(40960, 40960, full(36), 2 * 8 * 128 * BF16 * 36, 1),
    "qwen3-8b": Expect(40960, 40960, full(36), 2 * 8 * 128 * BF16 * 36, 1),
    "qwen3-14b": Expect(40960, 40960, full(40), 2 * (8 // 2) * 128 * BF16 * 40, 1),
    "qwen3-32b": Expect(40960, 40960, full(64), 2 * (8 // 4) * 128 * BF16 * 64, 1),
    "qwen3-30b-a3b": Expect(40960, 40960, full(48), 2 * (4 // 2) * 128 * BF16 * 48, 1),
    # Mistral v0.3: sliding_window null. Mixtral v0.1 (first revision): window 4096 on every layer,
    # one uniform sliding-window group. head_dim 4096 / 32 = 128.
    "mistral-7b-instruct-v0.3": Expect(32768, 32768, full(32), 2 * 8 * 128 * BF16 * 32, 1),
    "mixtral-8x7b-v0.1": Expect(32768, 32768, {"sliding_window": 32}, 2 * (8 // 2) * 128 * BF16 * 32, 1),
    # Gemma 2: Gemma2Config's default length 8192 and 1:1 alternation (even layers slide): 21 + 21 and
    # 23 + 23 layers, two groups. 9B: 8 KV heads x 256; 27B at TP 2: 16 // 2 = 8 x 128.
    "gemma-2-9b": Expect(8192, 8192, {"sliding_window": 21, "full": 21}, 2 * 8 * 256 * BF16 * 42, 2),
    "gemma-2-27b": Expect(8192, 8192, {"sliding_window": 23, "full": 23}, 2 * 8 * 128 * BF16 * 46, 2),
    # Gemma 3 4B: text_config has no length, Gemma3TextConfig gives 131072 (not x8 again). 34 layers,
    # every 6th full: layers 5, 11, 17, 23, 29 = 5 full, 29 sliding. Group size min(5, 29) = 5:
    # 1 full group + ceil(29 / 5) = 6 sliding groups = 7.
    "gemma-3-4b-it": Expect(131072, 131072, {"sliding_window": 29, "full": 5}, 2 * 4 * 256 * BF16 * 34, 7),
    # Phi-4: no rope scaling, 10 KV heads x 5120/40 = 128. Phi-3.5-mini: LongRoPE, 131072 derived but
    # 4096 when unset; its sliding_window 262144 makes all 32 layers sliding ones (one group).
    "phi-4": Expect(16384, 16384, full(40), 2 * 10 * 128 * BF16 * 40, 1),
    "phi-3.5-mini-instruct": Expect(131072, 4096, {"sliding_window": 32}, 2 * 32 * 96 * BF16 * 32, 1),
    # DeepSeek MLA: yarn, original 4096 x 40 = 163840; latent 512 + 64 = 576 per layer, replicated.
    "deepseek-v2-lite-chat": Expect(4096 * 40, 4096 * 40, {"mla": 27}, 576 * BF16 * 27, 1),
    "deepseek-v3": Expect(4096 * 40, 4096 * 40, {"mla": 61}, 576 * BF16 * 61, 1),
    # gpt-oss: yarn 4096 x 32 = 131072; sliding (128) and full alternate; 8 KV heads x 64.
    "gpt-oss-20b": Expect(
        4096 * 32, 4096 * 32, {"sliding_window": 12, "full": 12}, 2 * 8 * 64 * BF16 * 24, 2
    ),
    "gpt-oss-120b": Expect(
        4096 * 32, 4096 * 32, {"sliding_window": 18, "full": 18}, 2 * (8 // 2) * 64 * BF16 * 36, 2
    ),
    # Jamba 1.5 Mini: attention at i % 8 == 4 (4 layers), 28 Mamba-1 layers; TP 2: 8 // 2 = 4 KV heads.
    # Group size min(4, 28) = 4: 1 attention group + 28 / 4 = 7 Mamba groups.
    "jamba-1.5-mini": Expect(262144, 262144, {"full": 4, "mamba": 28}, 2 * 4 * 128 * BF16 * 4, 8),
    # NemotronH: '*' attention, 'M' Mamba-2. Nano 30B: 6 + 23 at TP 2 (2 // 2 = 1 KV head x 128), groups
    # 1 + ceil(23 / 6) = 5. 8B: 4 '*' and 24 'M', 8 KV heads x head_dim default 128, groups 1 + 6 = 7.
    "nemotron-3-nano-30b-a3b": Expect(262144, 262144, {"full": 6, "mamba": 23}, 2 * 1 * 128 * BF16 * 6, 5),
    "nemotron-h-8b-base-8k": Expect(8192, 8192, {"full": 4, "mamba": 24}, 2 * 8 * 128 * BF16 * 4, 7),
    # Qwen3.5 9B: 8 full-attention layers (every 4th), 24 gated-delta-net layers; 4 KV heads x 256.
    # Group size 8: 1 attention group + 24 / 8 = 3 linear-attention groups.
    "qwen3.5-9b": Expect(262144, 262144, {"mamba": 24, "full": 8}, 2 * 4 * 256 * BF16 * 8, 4),
}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / f"{name}.json").read_text())
    return data


def test_the_corpus_has_every_file_and_each_names_its_source() -> None:
    names = sorted(p.stem for p in CORPUS.glob("*.json"))
    assert names == sorted(EXPECTED) and len(names) >= 25
    for name in names:
        entry = load(name)
        assert entry["source"] and isinstance(entry["tp"], int) and entry["config"]["model_type"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_derived_length_matches_vllms_rules(name: str) -> None:
    d = derive_max_model_len(load(name)["config"], "0.26.0")
    assert (d.value, d.default) == EXPECTED[name][:2]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_layer_specs_and_kv_bytes_per_token_per_gpu(name: str) -> None:
    entry, want = load(name), EXPECTED[name]
    specs = layer_specs(entry["config"], tp=entry["tp"], max_model_len=want.default)
    layout = kv_layout(specs)
    assert kinds_summary(specs) == want.kinds
    assert layout.kv_bytes_per_token == want.kv_per_token
    assert len(layout.groups) == want.groups


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_memory_estimate_uses_the_same_layout(name: str) -> None:
    entry, want = load(name), EXPECTED[name]
    args = {"kv-cache-dtype": "bfloat16", "dtype": "bfloat16"}
    e = estimate(entry["config"], None, {}, tp=entry["tp"], total_bytes=140 * GiB, gpu="NVIDIA H200",
                 utilization=0.9, max_model_len=want.default, args=args)  # fmt: skip
    assert e.kv_per_token == want.kv_per_token


def test_sliding_window_layers_keep_only_their_window() -> None:
    # gpt-oss-20b, one request of 131,072 tokens, 8,192 batched tokens. Page per block per layer:
    # 16 x 8 x 64 x 2 x 2 B = 32,768 B. Full layers: ceil(131072 / 16) = 8,192 blocks; sliding layers:
    # ceil(min(128 - 1 + 8192, 131072) / 16) + 1 = 520 + 1 = 521 blocks. 12 layers per group.
    layout = kv_layout(layer_specs(load("gpt-oss-20b")["config"], tp=1))
    assert layout.one_request_bytes(131072, 8192) == 12 * 32768 * (8192 + 521)
    # Costed as full attention (the old figure) it would be 24 layers x 8,192 blocks: +88%.
    assert 24 * 32768 * 8192 / layout.one_request_bytes(131072, 8192) > 1.8


def test_capacity_counts_one_block_per_group_per_token() -> None:
    # gpt-oss-20b with 10 GiB of KV memory: blocks = 10 GiB // (32,768 B x 12 layers) = 27,306;
    # tokens = 27,306 // 2 groups x 16 = 218,448 (vLLM's "GPU KV cache size").
    layout = kv_layout(layer_specs(load("gpt-oss-20b")["config"], tp=1))
    assert layout.capacity_tokens(10 * GiB) == (10 * GiB // (32768 * 12)) // 2 * 16 == 218448


def test_uniform_model_capacity_is_memory_over_bytes_per_token() -> None:
    # Llama 3.1 8B: 131,072 B per token, 10 GiB -> 81,920 tokens, in 16-token blocks.
    layout = kv_layout(layer_specs(load("llama-3.1-8b")["config"], tp=1))
    assert layout.capacity_tokens(10 * GiB) == 10 * GiB // (131072 * 16) * 16 == 81920
    assert layout.one_request_bytes(131072, 8192) == 131072 * 131072


def test_jamba_mamba_state_sets_the_attention_block_size() -> None:
    # Jamba 1.5 Mini at TP 2, bf16 state: Mamba-1 inner = 2 x 4096 = 8192, 4096 per GPU;
    # conv (4 - 1) x 4096 x 2 B = 24,576 + ssm 4096 x 16 x 2 B = 131,072 -> 155,648 B a layer.
    # Attention token 2 x 4 x 128 x 2 B = 2,048 B: block 16 x ceil(155,648 / (16 x 2,048)) = 80 tokens.
    specs = layer_specs(load("jamba-1.5-mini")["config"], tp=2, max_model_len=262144)
    attn = next(s for s in specs if s.kind == "full")
    mamba = next(s for s in specs if s.kind == "mamba")
    assert mamba.real_page_bytes == 3 * 4096 * 2 + 4096 * 16 * 2 == 155648
    assert (attn.block_size, attn.page_bytes, mamba.page_bytes) == (80, 80 * 2048, 80 * 2048)
    # One request: 4 layers per group x page x (ceil(262144 / 80) = 3,277 KV blocks + 7 Mamba blocks).
    assert kv_layout(specs).one_request_bytes(262144, 8192) == 4 * 80 * 2048 * (3277 + 7)


def test_nemotron_8b_mamba2_state_with_its_fp32_default() -> None:
    # NemotronHConfig: mamba_ssm_cache_dtype float32 (class default). TP 1: conv 3 x (128 x 64 +
    # 2 x 8 x 128) = 3 x 10,240 bf16 = 61,440 B; ssm 128 x 64 x 128 x 4 B = 4,194,304 B.
    cfg = resolve(load("nemotron-h-8b-base-8k")["config"])
    assert cfg.config["mamba_ssm_cache_dtype"] == "float32"
    assert "NemotronHConfig" in cfg.sources["head_dim"]
    specs = layer_specs(cfg, tp=1, mamba_ssm_bytes=4, max_model_len=8192)
    mamba = next(s for s in specs if s.kind == "mamba")
    assert mamba.real_page_bytes == 3 * 10240 * 2 + 128 * 64 * 128 * 4 == 4255744
    # Attention token 2 x 8 x 128 x 2 = 4,096 B: block 16 x ceil(4,255,744 / 65,536) = 16 x 65 = 1,040.
    assert next(s for s in specs if s.kind == "full").block_size == 1040


def test_family_defaults_name_their_source() -> None:
    gemma = resolve(load("gemma-3-4b-it")["config"])
    assert gemma.config["max_position_embeddings"] == 131072
    assert gemma.sources["max_position_embeddings"] == (
        "transformers Gemma3TextConfig.max_position_embeddings default"
    )
    jamba = resolve(load("jamba-1.5-mini")["config"])
    assert [i for i, t in enumerate(jamba.config["layers_block_type"]) if t == "attention"] == [4, 12, 20, 28]
    assert "JambaConfig.layers_block_type" in jamba.sources["layers_block_type"]
    qwen = resolve(load("qwen2.5-7b")["config"])
    assert qwen.config["sliding_window"] is None and "use_sliding_window" in qwen.sources["sliding_window"]


def test_deepseek_yarn_alias_scales_the_unscaled_length() -> None:
    # vLLM 0.26 treats only "yarn" as yarn: an alias multiplies max_position_embeddings itself.
    cfg = {**load("deepseek-v2-lite-chat")["config"]}
    cfg["rope_scaling"] = {**cfg["rope_scaling"], "type": "deepseek_yarn"}
    d = derive_max_model_len(cfg, "0.26.0")
    assert d.value == 163840 * 40 and "alias" in d.note


def test_mamba_prefix_caching_all_mode_aligns_blocks_to_the_ssd_chunk() -> None:
    # vLLM's "all" mode: attention tokens per Mamba state ceil(4,255,744 / 4,096) = 1,039, rounded up
    # to lcm(chunk_size 128 (NemotronHConfig default), 16) = 128: 9 x 128 = 1,152-token blocks; the
    # Mamba layers then keep a state per block: ceil(8192 / 1152) = 8 blocks a request.
    specs = layer_specs(load("nemotron-h-8b-base-8k")["config"], mamba_ssm_bytes=4, max_model_len=8192,
                        mamba_mode="all")  # fmt: skip
    assert {s.block_size for s in specs} == {1152}
    mamba = next(s for s in specs if s.kind == "mamba")
    assert mamba.max_memory_bytes(8192, 8192, "all") == 8 * 1152 * 4096


def test_nemotron_saved_by_transformers_5_has_no_layer_count() -> None:
    # transformers 5 writes NemotronH's layer list as layers_block_type and drops num_hidden_layers
    # (a property: the list's length). Same 52 layers, same 4 attention + 24 Mamba.
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    cfg = dict(load("nemotron-h-8b-base-8k")["config"])
    cfg["layers_block_type"] = [names[ch] for ch in cfg.pop("hybrid_override_pattern")]
    del cfg["num_hidden_layers"]
    resolved = resolve(cfg)
    assert resolved.config["num_hidden_layers"] == 52
    assert "len(layers_block_type)" in resolved.sources["num_hidden_layers"]
    assert kinds_summary(layer_specs(cfg, max_model_len=8192)) == {"mamba": 24, "full": 4}


# A vLLM v0.17.0 start seen in public (a blog post in the search index, file id 57769339834): a
# Qwen3.5-style hybrid, 40 layers of which 10 are full attention (every 4th), 2 KV heads x 256, fp8
# KV, gated delta net 16 key / 32 value heads of 128, conv 4. Its log: "Setting attention block size
# to 2096 tokens", "GPU KV cache size: 159,296 tokens" and "Maximum concurrency for 65,536 tokens per
# request: 8.00x" from 6.08 GiB of KV cache memory.
SEEN_QWEN35 = {
    "model_type": "qwen3_5_moe_text", "num_hidden_layers": 40, "full_attention_interval": 4,
    "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
}  # fmt: skip


def test_a_seen_vllm_log_of_a_gated_delta_net_hybrid() -> None:
    # GDN state: conv 3 x (2 x 16 x 128 + 32 x 128) x 2 B = 49,152 + fp32 state 32 x 128 x 128 x 4 B
    # = 2,097,152 -> 2,146,304 B. An fp8 token is 2 x 2 x 256 x 1 = 1,024 B: block
    # 16 x ceil(2,146,304 / 16,384) = 16 x 131 = 2,096 tokens, page 2,096 x 1,024 = 2,146,304 B.
    cfg = resolve(SEEN_QWEN35)
    specs = layer_specs(cfg, kv_dtype_bytes=1, mamba_ssm_bytes=4, max_model_len=65536, mamba_mode="align")
    layout = kv_layout(specs)
    assert {s.block_size for s in specs if s.kind == "full"} == {2096}
    assert (layout.page_bytes, layout.group_size, len(layout.groups)) == (2146304, 10, 4)
    available = int(6.08 * GiB)
    # 6.08 GiB // (2,146,304 x 10) = 304 blocks; 304 // 4 groups x 2,096 = 159,296 tokens.
    assert layout.num_blocks(available) == 304
    assert layout.capacity_tokens(available) == 159296
    # One request of 65,536: ceil(65536 / 2096) = 32 blocks + 2 in each of 3 linear groups = 38.
    assert f"{layout.max_concurrency(available, 65536, 8192, 'align'):.2f}" == "8.00"


def test_qwen3_5_state_dtype_is_the_configs_float32() -> None:
    # estimate() picks the config's mamba_ssm_dtype (4 B) for Qwen3.5, the model dtype elsewhere.
    e = estimate(SEEN_QWEN35, None, {}, tp=1, total_bytes=140 * GiB, gpu="NVIDIA H200", utilization=0.9,
                 max_model_len=65536, args={"kv-cache-dtype": "fp8", "dtype": "bfloat16"})  # fmt: skip
    assert e.ssm_dtype == "float32"
    assert {s.block_size for s in e.specs if s.kind == "full"} == {2096}
