"""Layer geometry as vLLM 0.26's model code builds it, where config.json alone misleads (issue 28):
Cohere2 sizes heads from hidden_size, Llama 4 chunks its RoPE layers and keeps the hybrid manager on,
Granite-4.0-H's Mamba inner size is expand x hidden_size, Zamba2 names its Mamba dims its own way and
runs a shared attention block beside the Mamba mixer of each hybrid layer. Figures worked by hand."""

from __future__ import annotations

from typing import Any

from reconcile.vllm import memory
from reconcile.vllm.kvgroups import kv_layout
from reconcile.vllm.kvspec import CHUNKED, FULL, MAMBA, SLIDING, layer_specs, mamba_state
from reconcile.vllm.memory import GiB, estimate
from reconcile.vllm.servedefaults import hybrid_manager
from reconcile.vllm.shape import model_shape

# The sizes the served tiny models use: hidden 256, 4 heads, 2 KV heads.
BASE: dict[str, Any] = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}


def _kinds(specs: Any) -> dict[int, tuple[str, ...]]:
    out: dict[int, tuple[str, ...]] = {}
    for s in specs:
        out[s.layer] = (*out.get(s.layer, ()), s.kind)
    return out


def _estimate(cfg: dict[str, Any], length: int = 131072, **args: Any) -> memory.MemoryEstimate:
    return estimate(cfg, None, {"model.safetensors": GiB}, tp=1, total_bytes=140 * GiB, gpu="NVIDIA H200",
                    utilization=0.9, max_model_len=length, args={"enforce-eager": True, **args})  # fmt: skip


def test_cohere2_heads_are_hidden_size_over_heads_whatever_head_dim_says() -> None:
    cfg = {**BASE, "model_type": "cohere2", "architectures": ["Cohere2ForCausalLM"], "num_hidden_layers": 8,
           "head_dim": 128, "sliding_window": 128, "sliding_window_pattern": 4}  # fmt: skip
    specs = layer_specs(cfg)
    # commandr.py: head_dim = 256 // 4 = 64, not 128: 16 tokens x 2 KV heads x 64 x 2 (K+V) x 2 B.
    assert {s.head_size for s in specs} == {64} and specs[0].page_bytes == 16 * 2 * 64 * 2 * 2
    # Cohere2Config: layer_types from sliding_window_pattern 4: every 4th layer global.
    assert [s.kind for s in specs] == [SLIDING, SLIDING, SLIDING, FULL] * 2
    e = _estimate(cfg)
    assert e.kv_per_token == 8 * 2 * 2 * 64 * 2 == 4096 and e.shape.head_dim == 64
    listed = {**cfg, "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["full_attention"] * 4}
    assert [s.kind for s in layer_specs(listed)] == [SLIDING] * 3 + [FULL] * 5  # an explicit list wins


def test_llama4_chunks_its_rope_layers_and_keeps_the_hybrid_manager() -> None:
    cfg = {**BASE, "model_type": "llama4_text", "num_hidden_layers": 8, "head_dim": 64,
           "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0] * 2}  # fmt: skip
    specs = layer_specs(cfg)
    assert [s.kind for s in specs] == [CHUNKED, CHUNKED, CHUNKED, FULL] * 2
    # The same split from transformers' default no_rope_layer_interval (4) when the list is absent.
    assert [s.kind for s in layer_specs({k: v for k, v in cfg.items() if k != "no_rope_layers"})] == [
        s.kind for s in specs
    ]
    assert hybrid_manager({}, specs)  # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1
    lay = kv_layout(specs, hybrid_manager=True)
    page = 16 * 2 * 64 * 2 * 2  # 8,192 B a block a layer
    # 2 full + 6 chunked: group size 2, 1 full + 3 chunked groups. One request of 131,072 tokens with
    # 16,384 in flight: full 8,192 blocks, chunked ceil(min(8,192 + 16,384, 131,072) / 16) = 1,536 each.
    assert (len(lay.groups), lay.group_size) == (4, 2)
    assert lay.one_request_bytes(131072, 16384) == 2 * page * (8192 + 3 * 1536)
    off = hybrid_manager({}, specs, {"VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "0"})
    whole = kv_layout(specs, hybrid_manager=off)
    assert not off and whole.one_request_bytes(131072, 16384) == 8 * page * 8192  # every layer full
    assert not hybrid_manager({"disable-hybrid-kv-cache-manager": True}, specs)


def test_granite_4_h_mamba_inner_size_is_expand_times_hidden() -> None:
    cfg = {**BASE, "model_type": "granitemoehybrid", "num_hidden_layers": 4, "mamba_expand": 2,
           "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 64,
           "mamba_d_conv": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"]}  # fmt: skip
    st = mamba_state(cfg, tp=1, conv_bytes=2, ssm_bytes=2)
    # granitemoehybrid.py: intermediate 2 x 256 = 512 (not 8 x 32 = 256); conv dim 512 + 2 x 1 x 64.
    assert st.shapes == ((3, 640), (8, 32, 64))


def test_zamba2_reads_its_own_names_and_its_hybrid_layers() -> None:
    cfg = {**BASE, "model_type": "zamba2", "architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": 6,
           "num_key_value_heads": 4, "attention_hidden_size": 512, "attention_head_dim": 128,
           "n_mamba_heads": 8, "mamba_headdim": 64, "mamba_ngroups": 1, "mamba_d_state": 64,
           "mamba_d_conv": 4, "mamba_expand": 2, "hybrid_layer_ids": [1, 4],
           "layers_block_type": ["linear_attention", "hybrid", "linear_attention", "linear_attention",
                                 "hybrid", "linear_attention"]}  # fmt: skip
    specs = layer_specs(cfg)
    assert _kinds(specs) == {0: (MAMBA,), 1: (FULL, MAMBA), 2: (MAMBA,), 3: (MAMBA,), 4: (FULL, MAMBA),
                             5: (MAMBA,)}  # fmt: skip
    # Mamba page: conv 3 x (512 + 2 x 64) + ssm 8 x 64 x 64, 2 B each = 69,376 B; an attention token is
    # 2 x 4 heads x 128 x 2 B = 2,048 B, so blocks of 16 x ceil(69,376 / (16 x 2,048)) = 48 tokens.
    full = next(s for s in specs if s.kind == FULL)
    mamba = next(s for s in specs if s.kind == MAMBA)
    assert mamba.real_page_bytes == (3 * 640 + 8 * 64 * 64) * 2 == 69376
    assert (full.block_size, full.page_bytes, mamba.page_bytes) == (48, 48 * 2048, 48 * 2048)
    assert [_kinds(layer_specs({k: v for k, v in cfg.items() if k != "layers_block_type"}))[i]
            for i in (1, 2)] == [(FULL, MAMBA), (MAMBA,)]  # fmt: skip
    shape = model_shape(cfg)
    assert shape.mamba is not None and (shape.mamba.layers, shape.attention_layers) == (6, 2)
    assert _estimate(cfg, 4096).fits  # no longer "memory not checked: ... none of mamba_num_heads"
