"""vLLM's KV cache grouping on small hand-made layer sets: page unification, padding, PP ranks, the
hybrid manager switched off, chunked local attention. Each expected figure is worked in the comment."""

from __future__ import annotations

from reconcile.vllm.kvgroups import kv_layout
from reconcile.vllm.kvspec import CHUNKED, FULL, SLIDING, LayerSpec, layer_specs, pp_layers


def attn(layer: int, kind: str = FULL, heads: int = 8, window: int | None = None) -> LayerSpec:
    # page = 16 tokens x heads x 128 x 2 (K+V) x 2 B
    return LayerSpec(layer, kind, heads, 128, 2, window, 16, 16 * heads * 128 * 2 * 2)


def test_uniform_layers_are_one_group() -> None:
    layout = kv_layout([attn(i) for i in range(4)])
    assert (len(layout.groups), layout.hybrid, layout.block_bytes) == (1, False, 4 * 65536)
    # 1 GiB / (4 x 64 KiB) = 4,096 blocks of 16 tokens.
    assert layout.capacity_tokens(1 << 30) == 4096 * 16


def test_smaller_pages_grow_their_block_to_the_largest_page() -> None:
    # Full layers with 8 heads (64 KiB pages), sliding ones with 4 (32 KiB): the sliding layers get
    # 32-token blocks so both pages are 64 KiB.
    specs = [attn(0), attn(1, SLIDING, heads=4, window=128), attn(2), attn(3, SLIDING, heads=4, window=128)]
    layout = kv_layout(specs)
    sliding = next(g for g in layout.groups if g.kind == SLIDING)
    assert (sliding.spec.block_size, sliding.spec.page_bytes, layout.page_bytes) == (32, 65536, 65536)
    # The reported size uses the smallest block: 1 GiB / (64 KiB x 2 layers) // 2 groups x 16.
    assert layout.capacity_tokens(1 << 30) == (1 << 30) // (65536 * 2) // 2 * 16


def test_a_lopsided_split_is_padded() -> None:
    # 2 full + 5 sliding layers: group size 2, sliding split into ceil(5 / 2) = 3 groups, 1 padding slot.
    specs = [attn(0), attn(1)] + [attn(i, SLIDING, window=64) for i in range(2, 7)]
    layout = kv_layout(specs)
    assert (layout.group_size, len(layout.groups), layout.padding_layers) == (2, 4, 1)
    # Strided as vLLM does: layers 2..6 -> (2, 5), (3, 6), (4,).
    assert [g.layers for g in layout.groups if g.kind == SLIDING] == [(2, 5), (3, 6), (4,)]


def test_near_equal_counts_use_the_larger_group_size() -> None:
    # 12 sliding + 13 full (gpt-oss + an eagle layer): 13 < 1.5 x 12, so groups of 13, not 12.
    specs = [attn(i, SLIDING, window=128) for i in range(12)] + [attn(i) for i in range(12, 25)]
    layout = kv_layout(specs)
    assert (layout.group_size, len(layout.groups), layout.padding_layers) == (13, 2, 1)


def test_without_the_hybrid_manager_sliding_layers_count_as_full() -> None:
    specs = [attn(0), attn(1, SLIDING, window=128)]
    layout = kv_layout(specs, hybrid_manager=False)
    assert (len(layout.groups), layout.hybrid) == (1, False)
    # Both layers keep every token: 2 x ceil(4096 / 16) pages.
    assert layout.one_request_bytes(4096, 8192) == 2 * 256 * 65536


def test_chunked_local_attention_keeps_a_chunk_plus_the_batch() -> None:
    cfg = {"model_type": "llama4_text", "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 8,
           "head_dim": 128, "hidden_size": 1024, "attention_chunk_size": 1024,
           "layer_types": ["chunked_attention"] * 3 + ["full_attention"]}  # fmt: skip
    specs = layer_specs(cfg)
    assert [s.kind for s in specs] == [CHUNKED, CHUNKED, CHUNKED, FULL]
    layout = kv_layout(specs)
    # Group size 1: 1 full group + 3 chunked groups. One request of 65,536 tokens, 2,048 batched:
    # full ceil(65536 / 16) = 4,096 blocks, chunked ceil(min(1024 + 2048, 65536) / 16) = 192 each.
    assert layout.one_request_bytes(65536, 2048) == 1 * 65536 * (4096 + 3 * 192)


def test_pipeline_ranks_hold_their_own_layers() -> None:
    # vLLM's get_pp_indices: 10 layers on 4 ranks -> 2, 3, 3, 2 (the remainder before the last rank).
    assert [len(pp_layers(10, 4, r)) for r in range(4)] == [2, 3, 3, 2]
    assert list(pp_layers(10, 4, 1)) == [2, 3, 4]
    layout = kv_layout([attn(i) for i in range(10)])
    rank1 = layout.project(pp_layers(10, 4, 1))
    # 3 layers on rank 1: 1 GiB / (3 x 64 KiB) = 5,461 blocks.
    assert rank1.capacity_tokens(1 << 30) == (1 << 30) // (3 * 65536) * 16
    assert rank1.one_request_bytes(4096, 8192) == 3 * 256 * 65536


def test_estimated_max_length_is_the_longest_that_fits() -> None:
    # 4 full layers, 64 KiB pages: 100 MiB holds floor(100 MiB / 256 KiB) = 400 blocks = 6,400 tokens.
    layout = kv_layout([attn(i) for i in range(4)])
    assert layout.max_len_that_fits(100 << 20, 8192, upper=1 << 20) == 6400
    assert layout.max_len_that_fits(1000, 8192, upper=1 << 20) == 0
