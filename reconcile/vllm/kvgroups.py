"""KV-cache groups of a model on one GPU, as vLLM's (hybrid) KV cache manager forms them.

Mirrors vllm/v1/core/kv_cache_utils.py (get_kv_cache_groups, unify_kv_cache_spec_page_size,
_get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups,
_max_memory_usage_bytes_from_groups, _report_kv_cache_config): the memory one request of
max-model-len needs, and the "GPU KV cache size: N tokens" a budget gives. Used by engine.memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconcile.record import Record
from reconcile.vllm.kvspec import CHUNKED, FULL, MAMBA, MLA, SLIDING, LayerSpec


class KVGroup(Record):
    """Layers sharing one block table (vLLM's KVCacheGroupSpec)."""

    kind: str
    layers: tuple[int, ...]  # layer indices (for PP, those on the rank the layout was projected to)
    spec: LayerSpec  # the merged spec; for a uniform-type group, the largest-page layer's


class KVLayout(Record):
    """How vLLM lays the KV cache of one GPU out in blocks."""

    groups: tuple[KVGroup, ...]
    group_size: int  # layers per group after padding (hybrid); all layers (one group)
    page_bytes: int  # bytes of one block across one group-layer (hybrid), or of all layers (uniform)
    hybrid: bool  # several groups sharing pools (vLLM's uniform-page-size path)
    padding_layers: int  # empty slots vLLM pads the last group of a kind with ("may waste ...")

    @property
    def block_bytes(self) -> int:
        """Memory one block id costs (num_blocks = available // block_bytes)."""
        return self.page_bytes * (self.group_size if self.hybrid else 1)

    @property
    def min_block_size(self) -> int:
        return min((g.spec.block_size for g in self.groups), default=0)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token takes on this GPU, summed over its attention layers (the per-layer
        page / block size; sliding layers counted as if they kept every token)."""
        return sum(g.spec.bytes_per_token * len(g.layers) for g in self.groups if g.kind != MAMBA)

    @property
    def charged_bytes_per_token(self) -> int:
        """What vLLM's "GPU KV cache size" divides the budget by: a token costs one block slot in
        every group (hybrid), so the Mamba and padding share are in it."""
        if not self.groups:
            return 0
        per_token_slot = self.block_bytes * len(self.groups) if self.hybrid else self.block_bytes
        return per_token_slot // self.min_block_size

    def one_request_bytes(self, max_model_len: int, in_flight_tokens: int, mamba_mode: str = "none") -> int:
        """What vLLM's startup check needs for one request of max_model_len
        (`_max_memory_usage_bytes_from_groups`)."""
        if not self.groups:
            return 0
        if not self.hybrid:
            return sum(
                g.spec.max_memory_bytes(max_model_len, in_flight_tokens, mamba_mode) * len(g.layers)
                for g in self.groups
            )
        blocks = sum(
            _cdiv(g.spec.max_memory_bytes(max_model_len, in_flight_tokens, mamba_mode), self.page_bytes)
            for g in self.groups
        )
        return self.group_size * self.page_bytes * blocks

    def num_blocks(self, available_bytes: int) -> int:
        if not self.groups or available_bytes <= 0:
            return 0
        return available_bytes // self.block_bytes

    def capacity_tokens(
        self,
        available_bytes: int,
        max_model_len: int | None = None,
        in_flight_tokens: int = 0,
        mamba_mode: str = "none",
    ) -> int:
        """The "GPU KV cache size: N tokens" vLLM logs for this much KV cache memory.

        vLLM 0.26 logs max concurrency x max_model_len (get_kv_cache_capacity), so a sliding-window
        or Mamba request, which holds fewer blocks than its length, counts for more tokens than the
        blocks hold. Without a max_model_len (auto), the tokens the blocks of one group hold."""
        if not self.groups:
            return 0
        if not max_model_len:
            return self.num_blocks(available_bytes) // len(self.groups) * self.min_block_size
        concurrency = self.max_concurrency(available_bytes, max_model_len, in_flight_tokens, mamba_mode)
        return int(concurrency * max_model_len)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int, mamba_mode: str = "none") -> int:
        """Block ids one request of max_model_len takes (get_max_concurrency_for_kv_cache_config)."""
        mem = [g.spec.max_memory_bytes(max_model_len, in_flight_tokens, mamba_mode) for g in self.groups]
        if self.hybrid:
            need = self.group_size * sum(mem)
        else:
            need = sum(m * len(g.layers) for m, g in zip(mem, self.groups, strict=True))
        return _cdiv(need, self.block_bytes)

    def max_concurrency(
        self, available_bytes: int, max_model_len: int, in_flight_tokens: int, mamba_mode: str = "none"
    ) -> float:
        """vLLM's "Maximum concurrency for N tokens per request: X": blocks / blocks one request takes."""
        if not self.groups:
            return 0.0
        return self.num_blocks(available_bytes) / self.blocks_per_request(
            max_model_len, in_flight_tokens, mamba_mode
        )

    def max_len_that_fits(
        self, available_bytes: int, in_flight_tokens: int, upper: int, mamba_mode: str = "none"
    ) -> int:
        """vLLM's "estimated maximum model length": the longest max_model_len <= upper whose one
        request fits (0 if not even one token does). Binary search, as vLLM does."""
        if self.one_request_bytes(1, in_flight_tokens, mamba_mode) > available_bytes:
            return 0
        lo, hi, best = 1, upper, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.one_request_bytes(mid, in_flight_tokens, mamba_mode) <= available_bytes:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    def project(self, layers: Sequence[int]) -> KVLayout:
        """The layout as one pipeline rank holding `layers` sees it (vLLM groups the whole model,
        then each worker keeps its own layers of every group)."""
        keep = set(layers)
        groups = tuple(g._replace(layers=tuple(i for i in g.layers if i in keep)) for g in self.groups)
        if not self.hybrid:
            groups = tuple(g for g in groups if g.layers)
            size = sum(len(g.layers) for g in groups)
            page = sum(g.spec.page_bytes * len(g.layers) for g in groups)
            return KVLayout(groups, size, page, False, 0)
        size = max((len(g.layers) for g in groups), default=0)
        return self._replace(groups=groups, group_size=size)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _type_key(spec: LayerSpec) -> tuple[object, ...]:
    """What makes two layers' specs equal for vLLM (layer index aside)."""
    return (spec.kind, spec.num_kv_heads, spec.head_size, spec.dtype_bytes, spec.window, spec.block_size,
            spec.page_bytes, spec.mamba_shapes, spec.mamba_dtype_bytes)  # fmt: skip


def _slots_key(spec: LayerSpec) -> tuple[object, ...]:
    """UniformTypeKVCacheSpecs: layers that need the same token slots (kind, window, block size)."""
    kind = FULL if spec.kind == MLA else spec.kind
    return (kind, spec.window, spec.block_size)


def kv_layout(specs: Sequence[LayerSpec], *, hybrid_manager: bool = True) -> KVLayout:
    """vLLM's get_kv_cache_groups for these layer specs (all layers of the model on one TP rank).

    `hybrid_manager` False is `--disable-hybrid-kv-cache-manager`: with full attention present,
    sliding-window and chunked layers are kept whole, as full attention.
    """
    specs = list(specs)
    if not specs:
        return KVLayout((), 0, 0, False, 0)
    if not hybrid_manager and any(s.kind in (FULL, MLA) for s in specs):
        specs = [s._replace(kind=FULL, window=None) if s.kind in (SLIDING, CHUNKED) else s for s in specs]
    by_type: dict[tuple[object, ...], list[LayerSpec]] = {}
    for s in specs:
        by_type.setdefault(_type_key(s), []).append(s)
    if len(by_type) == 1 or (
        len({_slots_key(s) for s in specs}) == 1 and all(s.kind != MAMBA for s in specs)
    ):
        # One group: every layer gets the same blocks (uniform spec, or uniform type with mixed sizes).
        largest = max(specs, key=lambda s: s.page_bytes)
        group = KVGroup(largest.kind, tuple(s.layer for s in specs), largest)
        return KVLayout((group,), len(specs), sum(s.page_bytes for s in specs), False, 0)
    # Hybrid: unify page sizes by growing the block size of smaller pages.
    top = max(s.page_bytes for s in specs)
    unified: dict[tuple[object, ...], list[LayerSpec]] = {}
    for s in specs:
        if s.page_bytes != top:
            if top % s.page_bytes:
                raise ValueError(
                    f"layer {s.layer} ({s.kind}) page {s.page_bytes} B does not divide the largest "
                    f"page {top} B: vLLM cannot unify them (NotImplementedError at startup)"
                )
            s = s.with_block_size(s.block_size * (top // s.page_bytes))
        unified.setdefault(_type_key(s), []).append(s)
    counts = [len(v) for v in unified.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)  # fewer padding layers (gpt-oss + eagle: 12 sw + 13 full -> 13)
    groups: list[KVGroup] = []
    padding = 0
    for members in unified.values():
        n = _cdiv(len(members), group_size)
        padding += n * group_size - len(members)
        for i in range(n):
            part = members[i::n]  # strided, as vLLM does, so PP stages stay balanced
            groups.append(KVGroup(part[0].kind, tuple(s.layer for s in part), part[0]))
    return KVLayout(tuple(groups), group_size, top, True, padding)
