"""GPU memory math for a vLLM deployment: weights, KV cache and Mamba state per GPU, against the budget.

The KV cache is laid out as vLLM lays it (engine.kvspec per-layer specs, engine.kvgroups groups);
the budget is gpu-memory-utilization x CUDA's total memory, as vLLM's. Called by the preflight's
`memory.fit` rule, which prints `memory_table()` the way the reference article works it by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.record import Record
from reconcile.vllm.attention import Backend, Build, mla_backend
from reconcile.vllm.budget import (
    CUDA_GRAPH_BYTES,
    NVML_RESERVED_FALLBACK,
    GiB,
    MiB,
    Overhead,
    cuda_budget,
    cuda_total,
    default_batch,
    mamba2_profile_peak,
    mla_workspace,
    overhead,
    rope_cache,
    size,
)
from reconcile.vllm.dtypes import DTYPE_BYTES, kv_cache_dtype, model_dtype, ssm_dtype
from reconcile.vllm.families import resolve
from reconcile.vllm.kvgroups import KVLayout, kv_layout
from reconcile.vllm.kvspec import MAMBA, LayerSpec, layer_specs, pp_layers
from reconcile.vllm.limits import human_int, int_flag
from reconcile.vllm.servedefaults import hybrid_manager, in_flight_tokens, mamba_cache_mode, on, v2_runner
from reconcile.vllm.shape import ModelShape, model_shape
from reconcile.vllm.weightfiles import weight_files

__all__ = [
    "CUDA_GRAPH_BYTES",
    "NVML_RESERVED_FALLBACK",
    "GiB",
    "MemoryEstimate",
    "MiB",
    "Overhead",
    "cuda_budget",
    "cuda_total",
    "default_batch",
    "estimate",
    "kv_cache_dtype",
    "overhead",
    "size",
    "weight_files",
]  # fmt: skip


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    return max(1, shape.num_kv_heads // tp)


def kv_bytes_per_token(shape: ModelShape, tp: int, dtype_bytes: int) -> int:
    """KV cache bytes one token takes on one GPU: only attention layers hold it."""
    if shape.mla_dim is not None:  # one latent vector per layer, replicated on every GPU
        return shape.mla_dim * dtype_bytes * shape.attention_layers
    return 2 * kv_heads_per_gpu(shape, tp) * shape.head_dim * dtype_bytes * shape.attention_layers


def mamba_bytes_per_seq(shape: ModelShape, tp: int, conv_bytes: int, ssm_bytes: int) -> int:
    """Mamba-2 state of one sequence on one GPU, all Mamba layers (fixed, whatever the context)."""
    m = shape.mamba
    if m is None:
        return 0
    inner = m.num_heads * m.head_dim
    conv = (m.conv_kernel - 1) * ((inner + 2 * m.n_groups * m.state_size) // tp)
    ssm = (m.num_heads // tp) * m.head_dim * m.state_size
    return (conv * conv_bytes + ssm * ssm_bytes) * m.layers


class MemoryEstimate(Record):
    """Everything the memory table shows, per GPU (the pipeline rank with the least room)."""

    gpu: str  # "NVIDIA GeForce RTX 5090" or "spec [gpu] memory_gib"
    total: int  # CUDA's total memory of one GPU (what vLLM budgets from)
    utilization: float
    tp: int
    weights_total: int
    weight_files: int
    kv_dtype: str
    kv_dtype_source: str
    kv_dtype_bytes: int
    kv_heads: int
    shape: ModelShape
    kv_per_token: int  # KV bytes per token on one GPU, all attention layers (sliding ones included)
    max_model_len: int | None  # None: "auto" (vLLM fits it to memory)
    mamba_per_seq: int  # one sequence's Mamba state on one GPU, unpadded
    ssm_dtype: str
    max_num_seqs: int
    max_num_seqs_source: str  # "--max-num-seqs" or "vLLM default"
    overhead: Overhead
    notes: tuple[str, ...] = ()
    pp: int = 1
    layout: KVLayout | None = None  # vLLM's KV cache groups on this GPU; None: no cache-holding layer
    specs: tuple[LayerSpec, ...] = ()
    batched_tokens: int = 8192
    mamba_mode: str = "none"
    in_flight_tokens: int = 16384  # vLLM's max_in_flight_tokens (engine.budget.in_flight_tokens)
    attention_backend: Backend | None = None  # the MLA backend vLLM picks (MLA models only)
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes: the cache size, budget ignored
    blocks_override: int | None = None  # --num-gpu-blocks-override: the cache's block count

    @property
    def budget_source(self) -> str:
        """What sized the cache: vLLM's profile of the budget, or a flag that replaces it."""
        if self.blocks_override is not None:
            return "--num-gpu-blocks-override"
        return "--kv-cache-memory-bytes" if self.kv_cache_memory_bytes else "gpu-memory-utilization"

    @property
    def budget(self) -> int:
        return cuda_budget(self.total, self.utilization)

    @property
    def weights_per_gpu(self) -> int:
        return self.weights_total // (self.tp * self.pp)

    @property
    def kv_at_max_len(self) -> int:
        """KV cache one request of max-model-len takes on this GPU (vLLM's startup check, Mamba
        state and block padding included; sliding-window layers keep only their window)."""
        if self.layout is None or not self.max_model_len:
            return 0
        return self.layout.one_request_bytes(self.max_model_len, self.in_flight_tokens, self.mamba_mode)

    @property
    def mamba_total(self) -> int:
        return self.mamba_per_seq * self.max_num_seqs

    @property
    def available_for_cache(self) -> int:
        """What vLLM would report as "Available KV cache memory" (estimate). vLLM 0.26's
        Worker.determine_available_memory returns --kv-cache-memory-bytes as it is, without a memory
        profile and whatever gpu-memory-utilization says; get_kv_cache_configs then replaces it by
        --num-gpu-blocks-override x the bytes of one block, for the startup check and the capacity."""
        if self.blocks_override is not None and self.layout is not None and self.layout.groups:
            return self.blocks_override * self.layout.block_bytes
        if self.kv_cache_memory_bytes:
            return self.kv_cache_memory_bytes
        return self.budget - self.weights_per_gpu - self.overhead.total

    @property
    def one_request(self) -> int:
        """Cache one request of max-model-len needs (its Mamba state is in the layout's figure)."""
        return self.kv_at_max_len

    @property
    def fits(self) -> bool:
        return self.one_request <= self.available_for_cache

    @property
    def headroom(self) -> int:
        return self.available_for_cache - self.kv_at_max_len - max(0, self.mamba_total - self.mamba_per_seq)

    @property
    def kv_capacity_tokens(self) -> int:
        """Predicted "GPU KV cache size: N tokens" (vLLM's own block accounting)."""
        if self.layout is None:
            return 0
        return self.layout.capacity_tokens(
            max(0, self.available_for_cache), self.max_model_len, self.in_flight_tokens, self.mamba_mode
        )

    @property
    def max_len_that_fits(self) -> int:
        """The longest max-model-len one request can have (vLLM's "estimated maximum model length")."""
        if self.layout is None or self.available_for_cache <= 0:
            return 0
        upper = max(self.max_model_len or 0, 1 << 24)
        return self.layout.max_len_that_fits(
            self.available_for_cache, self.in_flight_tokens, upper, self.mamba_mode
        )


def gpu_layout(
    specs: tuple[LayerSpec, ...], pp: int, layers: int, hybrid_manager: bool = True
) -> KVLayout | None:
    """The layout of the pipeline rank with the fewest blocks per byte (the one that limits vLLM)."""
    if not specs:
        return None
    whole = kv_layout(specs, hybrid_manager=hybrid_manager)
    if pp <= 1:
        return whole
    ranks = [whole.project(pp_layers(layers, pp, r)) for r in range(pp)]
    return max(ranks, key=lambda lay: lay.block_bytes)


def estimate(
    config: Mapping[str, Any],
    hf_quant_config: Mapping[str, Any] | None,
    file_sizes: Mapping[str, int],
    *,
    tp: int,
    total_bytes: int,
    gpu: str,
    utilization: float,
    max_model_len: int | None,
    args: Mapping[str, Any],
    pp: int = 1,
    capability: int | None = None,
    build: Build | None = None,
    env: Mapping[str, str] | None = None,
) -> MemoryEstimate:
    """The memory table's numbers from config.json, the weight files and the server's flags
    (`args` keys without "--": kv-cache-dtype, dtype, max-num-seqs, max-num-batched-tokens,
    mamba-ssm-cache-dtype, mamba-cache-dtype, enforce-eager, block-size, enable-prefix-caching,
    disable-hybrid-kv-cache-manager, attention-backend, kv-cache-memory-bytes,
    num-gpu-blocks-override, mamba-block-size). `total_bytes` is CUDA's total (see
    cuda_total). `capability` (9.0 -> 90) and `build` (engine.attention.scan_build of the venv) pick
    an MLA model's backend and so its block size; `env` is the server's environment."""
    resolved = resolve(config)
    shape = model_shape(resolved.config)
    serve = model_dtype(_str(args.get("dtype")), shape)
    kv_name, kv_bytes, kv_source = kv_cache_dtype(
        _str(args.get("kv-cache-dtype")), hf_quant_config, config, serve
    )
    ssm = ssm_dtype(_str(args.get("mamba-ssm-cache-dtype")), shape, serve)
    conv_arg = _str(args.get("mamba-cache-dtype"))
    conv = conv_arg if conv_arg and conv_arg != "auto" else serve
    batched, seqs = default_batch(total_bytes, gpu)
    seqs_arg = args.get("max-num-seqs")
    seqs = int(seqs_arg) if isinstance(seqs_arg, int) else seqs
    batched = human_int(args.get("max-num-batched-tokens")) or batched  # "8K" as vLLM reads it
    block_arg = args.get("block-size")
    user_block = int(block_arg) if isinstance(block_arg, int) and not isinstance(block_arg, bool) else None
    backend = None
    if shape.mla_dim is not None:
        forced = args.get("attention-backend")
        backend = mla_backend(
            capability,
            resolved.config,
            kv_cache_dtype=kv_name,
            block_size=user_block,
            forced=forced if isinstance(forced, str) else None,
            build=build,
        )
    mamba_mode = mamba_cache_mode(resolved.config, shape, args)
    specs = layer_specs(
        resolved,
        tp=tp,
        kv_dtype_bytes=kv_bytes,
        mamba_conv_bytes=DTYPE_BYTES.get(conv, 2),
        mamba_ssm_bytes=DTYPE_BYTES.get(ssm, 4),
        block_size=user_block,
        max_model_len=max_model_len or 0,
        mamba_mode=mamba_mode,
        backend_block=backend.block_size if backend else None,
        mamba_block_size=int_flag(args.get("mamba-block-size")),
    )
    layout = gpu_layout(specs, pp, shape.layers, hybrid_manager(args, specs, env))
    block = layout.min_block_size if layout else 16
    files = weight_files(file_sizes)
    notes = []
    override = int_flag(args.get("num-gpu-blocks-override"))
    if not files:
        notes.append("no weight files seen (model not downloaded yet?): weights counted as 0")
    return MemoryEstimate(
        gpu=gpu,
        total=total_bytes,
        utilization=utilization,
        tp=tp,
        weights_total=sum(files.values()),
        weight_files=len(files),
        kv_dtype=kv_name,
        kv_dtype_source=kv_source,
        kv_dtype_bytes=kv_bytes,
        kv_heads=kv_heads_per_gpu(shape, tp),
        shape=shape,
        kv_per_token=layout.kv_bytes_per_token if layout else 0,
        max_model_len=max_model_len,
        mamba_per_seq=sum(s.real_page_bytes for s in specs if s.kind == MAMBA),
        ssm_dtype=ssm,
        max_num_seqs=seqs,
        max_num_seqs_source="--max-num-seqs" if isinstance(seqs_arg, int) else "vLLM default",
        overhead=overhead(
            shape,
            tp,
            batched,
            seqs,
            args.get("enforce-eager") is True,
            mla_workspace(resolved.config, tp, max_model_len or 0, seqs, block, DTYPE_BYTES.get(serve, 2)),
            rope_cache(resolved.config, shape.head_dim, DTYPE_BYTES.get(serve, 2)),
            mamba2_profile_peak(resolved.config, shape, tp, batched, DTYPE_BYTES.get(serve, 2)),
        ),
        notes=tuple(notes),
        pp=pp,
        layout=layout,
        specs=specs,
        batched_tokens=batched,
        mamba_mode=mamba_mode,
        in_flight_tokens=in_flight_tokens(
            batched, pp, on(args, "async-scheduling"), v2_runner(config, shape)
        ),
        attention_backend=backend,
        kv_cache_memory_bytes=human_int(args.get("kv-cache-memory-bytes")) or None,
        blocks_override=override,
    )


def _str(value: object) -> str | None:
    return value.lower() if isinstance(value, str) else None
