"""The memory budget of one GPU as vLLM counts it: gpu-memory-utilization x CUDA's total, less the
non-KV overhead its memory profile finds (estimated here). Used by engine.memory and probes.gpu.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.record import Record
from reconcile.vllm.architectures import latent_cache
from reconcile.vllm.shape import MIXER2, ModelShape, mamba2_dims

GiB = 1024**3
MiB = 1024**2
# Overhead estimate (per GPU, inside the gpu-memory-utilization budget): the terms vLLM's memory
# profile reports besides weights. Calibration: vLLM's profile of Llama-3.1-8B (hidden 4096) on an
# 80 GB H100 logs "non_torch_memory takes 0.12GiB; PyTorch activation peak memory takes 1.19GiB;
# ... KV Cache is 54.93GiB"; at 8,192 batched tokens, 36 bytes per hidden unit per batched token
# gives 1.13 GiB of activations and 54.74 GiB of cache (tests/test_engine_memory.py).
NON_TORCH_BYTES = GiB // 4  # cuBLAS/NCCL workspaces, allocator slack
NON_TORCH_TP_BYTES = GiB // 4  # tensor parallel: NCCL and custom all-reduce buffers
ACTIVATION_BYTES_PER_HIDDEN_TOKEN = 36
LOGITS_BYTES = 4  # the sampler's dummy run: fp32 logits for max-num-seqs rows
CUDA_GRAPH_BYTES = GiB // 2  # captured graphs' pools; 0 with --enforce-eager
# Triton's benchmarker (triton.testing.do_bench; the CUDA driver's get_empty_cache_for_benchmark)
# allocates 256 MiB with torch to flush the L2 cache before each timed launch of an autotuned kernel.
TRITON_AUTOTUNE_FLUSH_BYTES = 256 * MiB
BLOCK_TOKENS = 16
# NVML's total counts memory the driver reserves, which cudaMemGetInfo's total (vLLM's) leaves out:
# 616 MiB on an H200 with driver 580 (NVML v2 memory info reports it as `reserved`).
NVML_RESERVED_FALLBACK = 616 * MiB


def cuda_total(nvml_total: int, nvml_reserved: int | None) -> int:
    """CUDA's total memory (what vLLM budgets from) from NVML's: total less the driver's reserve."""
    return nvml_total - (NVML_RESERVED_FALLBACK if nvml_reserved is None else nvml_reserved)


def cuda_budget(cuda_total_bytes: int, utilization: float) -> int:
    """vLLM's memory budget per GPU: gpu_memory_utilization x cudaMemGetInfo's total."""
    return int(cuda_total_bytes * utilization)


def default_batch(total_bytes: int, gpu_name: str) -> tuple[int, int]:
    """vLLM's `vllm serve` defaults (max-num-batched-tokens, max-num-seqs) for a GPU (get_batch_defaults)."""
    if total_bytes >= 70 * GiB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


class Overhead(Record):
    non_torch: int
    activation: int  # the larger of the dense estimate and mamba2_peak
    logits: int
    cuda_graphs: int
    mla_workspace: int = 0
    rope_cache: int = 0
    mamba2_peak: int = 0  # what a Mamba-2 layer holds at its peak in vLLM's profile run (0: none)

    @property
    def total(self) -> int:
        return (
            self.non_torch
            + self.activation
            + self.logits
            + self.cuda_graphs
            + self.mla_workspace
            + self.rope_cache
        )


def overhead(
    shape: ModelShape,
    tp: int,
    batched_tokens: int,
    max_num_seqs: int,
    eager: bool,
    mla_workspace: int = 0,
    rope_cache: int = 0,
    mamba2_peak: int = 0,
) -> Overhead:
    """vLLM's profile run holds the larger of two peaks: a dense layer's (the calibrated estimate) and,
    in a Mamba-2 model, a Mamba-2 layer's (`mamba2_peak`, see mamba2_profile_peak)."""
    dense = batched_tokens * shape.hidden_size * ACTIVATION_BYTES_PER_HIDDEN_TOKEN
    return Overhead(
        non_torch=NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tp > 1 else 0),
        activation=max(dense, mamba2_peak),
        logits=shape.vocab_size * max_num_seqs * LOGITS_BYTES,
        cuda_graphs=0 if eager else CUDA_GRAPH_BYTES,
        mla_workspace=mla_workspace,
        rope_cache=rope_cache,
        mamba2_peak=mamba2_peak,
    )


def mamba2_profile_peak(
    config: Mapping[str, Any],
    shape: ModelShape,
    tp: int,
    batched_tokens: int,
    dtype_bytes: int,
    *,
    tuned: bool = False,
) -> int:
    """The most a Mamba-2 layer holds at once in vLLM 0.26's profile run, which feeds it
    max-num-batched-tokens (T) with no attention metadata (gpu_model_runner.profile_run ->
    _dummy_run(is_profile=True)); 0 for a model without MambaMixer2 layers. With no metadata,
    MambaMixer2.conv_ssm_forward (model_executor/layers/mamba/mamba_mixer2.py) runs no SSD scan over
    T: it warms the SSD kernels up on chunk_size tokens and copies its conv input. Per GPU, b bytes
    an element, held from MambaMixer2.forward through its norm:
      - the layer's input and residual (NemotronH/Granite/Zamba2 decoder layers): 2 x T x hidden x b;
      - in_proj's output: T x (2 x intermediate + 2 x n_groups x ssm_state_size + num_heads) / tp x b
        (n_groups replicated up to tp where it does not divide);
      - ssm_output, allocated before the mixer op: T x num_heads / tp x head_dim x b;
    and then the largest of three transients:
      - _warmup_ssd_kernels' first call: the five SSD Triton kernels (ops/ssd_*.py) are
        @triton.autotune'd, and Triton's do_bench allocates a 256 MiB L2-flush tensor with torch
        while it times each config (TRITON_AUTOTUNE_FLUSH_BYTES). vLLM sets TRITON_CACHE_AUTOTUNING=1
        (env_override.py), so a later start whose kernel keys (chunk size, head dim, state size,
        heads, dtypes) are in the Triton cache skips it (`tuned`); the plan counts the first start;
      - the profile path's `hidden_states_B_C.transpose(0, 1).clone().transpose(0, 1).contiguous()`:
        two copies of T x conv_dim / tp x b;
      - Mixer2RMSNormGated: with n_groups != 1 or tp > 1 its forward_native works in fp32, and holds
        two T x intermediate / tp x 4 B tensors at a time (x * silu(gate.float()), then the grouped
        variance); else rms_norm_gated's Triton kernel writes one T x intermediate / tp x b output.
    The lab's H200 serves (vLLM 0.26.0, 8,192 tokens, docs/preflight.md "Issue 28"): nemotronh-pad
    (hidden 256, 64 heads x 64, 8 groups x 128) 8 + 161 + 64 + max(256, 192, 256) = 489 MiB against
    the logged 0.53 GiB peak; granite-h 292 MiB against 0.32 GiB; zamba2's serve found granite-h's
    kernel keys tuned (its warmup took 3 s against 59 s) and logged 0.09 GiB.

    Falcon-H1 (models/falcon_h1.py) differs in three ways. Its parallel hybrid layer holds four
    T x hidden tensors while the mixer runs: the layer's input (its residual), the normed input, the
    attention branch's output and the mixer's input (normed x ssm_in_multiplier). Its mixer scales
    in_proj's output by `mup_vector` (`projected_states = projected_states * mup_vector`): the product
    is a second T x in_proj tensor allocated while the first is still referenced, which is freed when
    the name is rebound, so the multiply is a phase of its own (inputs + 2 x in_proj) beside the later
    one (inputs + in_proj + ssm_output + the largest transient). The later one is always the larger by
    at least ssm_output + 2 x n_groups x state - heads > 0 (in_proj = intermediate + conv_dim + heads,
    and the clone alone is 2 x conv_dim), so in the eager profile run the copy never sets the peak;
    it is counted as vLLM allocates it all the same. And with `mamba_rms_norm` false (FalconH1Config's
    default) the mixer's norm is `x * silu(gate.float())`, the fp32 path (two T x intermediate x 4 B
    tensors at once)."""
    if shape.mamba is None or shape.model_type not in MIXER2:
        return 0
    d = mamba2_dims(config, tp)
    hidden = shape.hidden_size
    inner, heads = d.inner // tp, d.heads // tp
    conv_dim = (d.inner + 2 * d.groups * d.state) // tp
    in_proj = inner + conv_dim + heads
    falcon = shape.model_type in MUP_VECTOR
    inputs = batched_tokens * dtype_bytes * (4 if falcon else 2) * hidden
    held = inputs + batched_tokens * dtype_bytes * (in_proj + heads * d.head_dim)
    gate_only = falcon and not config.get("mamba_rms_norm", False)
    native_norm = d.config_groups != 1 or tp > 1 or gate_only
    norm = batched_tokens * inner * (2 * 4 if native_norm else dtype_bytes)
    clone = 2 * batched_tokens * conv_dim * dtype_bytes
    later = held + max(0 if tuned else TRITON_AUTOTUNE_FLUSH_BYTES, clone, norm)
    mup = inputs + 2 * batched_tokens * in_proj * dtype_bytes if falcon else 0
    return max(later, mup)


# Mixers that scale in_proj's output by a mup_vector buffer (vLLM 0.26 falcon_h1.py), in a parallel
# hybrid layer (attention and Mamba-2 side by side).
MUP_VECTOR = frozenset({"falcon_h1"})


def rope_cache(config: Mapping[str, Any], head_dim: int, dtype_bytes: int) -> int:
    """RotaryEmbedding's cos/sin cache, a buffer vLLM counts with the weights: max positions x rotary
    dims in the model dtype (YaRN's: original x factor positions; linear's: factor x positions). The
    H200 serve of two tiny 1,048,576-position models logged 0.27 GiB less KV cache memory than the
    same models at 4,096: 1,048,576 x 128 x 2 B = 0.25 GiB."""
    if config.get("model_type") in _NO_ROPE:
        return 0
    rotary = _int(config, "qk_rope_head_dim") or head_dim
    factor = config.get("partial_rotary_factor")
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < 1:
        rotary = int(rotary * factor)
    positions = _int(config, "max_position_embeddings")
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    rope = rope if isinstance(rope, Mapping) else {}
    kind, scale = str(rope.get("rope_type", rope.get("type"))), rope.get("factor")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        original = rope.get("original_max_position_embeddings")
        if kind in ("yarn", "deepseek_yarn") and isinstance(original, int):
            positions = int(original * scale)
        elif kind in ("linear", "dynamic"):  # vLLM's linear / dynamic-NTK caches cover factor x positions
            positions = int(positions * scale)
    return positions * rotary * dtype_bytes


_NO_ROPE = {"nemotron_h", "jamba", "mamba", "mamba2", "falcon_mamba"}  # attention without rotary embedding


def mla_workspace(
    config: Mapping[str, Any], tp: int, max_model_len: int, max_num_seqs: int, block: int, dtype_bytes: int
) -> int:
    """The tensor vLLM's MLA profile run allocates to stand for the up-projected prefill context
    (MLAAttention.forward with no metadata): workspace rows x heads/GPU x (qk_nope + v head dims).
    Rows: MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size, at most 64k tokens.
    The H200 serve of a tiny DeepSeek-V2 (16 heads, 128 + 128) logged 0.57 GiB less KV cache memory
    than a dense model of its size: 65,536 x 16 x 256 x 2 B = 0.50 GiB of it."""
    if not latent_cache(config):
        return 0
    rows = min(max(8 * max_model_len, 4 * max_num_seqs * block), 64 * 1024)
    rows = max(rows, max_num_seqs * block)
    heads = _int(config, "num_attention_heads") // max(1, tp)
    dims = _int(config, "qk_nope_head_dim") + _int(config, "v_head_dim")
    return rows * heads * dims * dtype_bytes


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def size(n: int) -> str:
    """3,072 B / 24.5 MiB / 1.50 GiB."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n:,} B"
