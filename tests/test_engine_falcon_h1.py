"""Falcon-H1's Mamba-2 profile peak (vLLM 0.26.0 models/falcon_h1.py, layers/mamba/mamba_mixer2.py):
the parallel hybrid layer's four T x hidden tensors, in_proj's output scaled by `mup_vector` (a second
T x in_proj tensor at the multiply), and the fp32 gate of a mixer without RMS norm. The config is the
one transformers 5.17's FalconH1Config writes for tools/preflight_serve_check.py's falcon-h1 case."""

from __future__ import annotations

from typing import Any

from reconcile.vllm.budget import TRITON_AUTOTUNE_FLUSH_BYTES, mamba2_profile_peak
from reconcile.vllm.families import resolve
from reconcile.vllm.memory import estimate

T = 8192  # max-num-batched-tokens on an H200
FALCON_H1: dict[str, Any] = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "dtype": "bfloat16",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "mamba_d_ssm": 512,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_rms_norm": False,
    "ssm_multipliers": [1.0, 0.5, 0.25, 0.25, 2.0],
}
# in_proj: z and x (2 x 512), B and C (2 x 1 x 64), dt (8 heads); conv_dim 512 + 128; ssm_output 8 x 64.
IN_PROJ, CONV_DIM, SSM_OUT = 512 + 640 + 8, 640, 512


def _peak(config: dict[str, Any], tuned: bool = False) -> int:
    files = {"model.safetensors": 10 * 2**20}
    e = estimate(config, None, files, tp=1, total_bytes=150 * 2**30, gpu="NVIDIA H200", utilization=0.1,
                 max_model_len=8192, args={"enforce-eager": True})  # fmt: skip
    return mamba2_profile_peak(resolve(config).config, e.shape, 1, T, 2, tuned=tuned)


def test_falcon_h1s_parallel_layer_holds_four_inputs_and_its_gate_in_fp32() -> None:
    # The residual, the normed input, the attention branch's output and the mixer's scaled input.
    held = 4 * T * 256 * 2 + T * (IN_PROJ + SSM_OUT) * 2
    assert _peak(FALCON_H1) == held + TRITON_AUTOTUNE_FLUSH_BYTES  # first start: the autotune flush
    # Tuned: x * silu(gate.float()) holds two T x 512 x 4 B tensors, more than the conv input's copies.
    assert _peak(FALCON_H1, tuned=True) == held + max(T * 512 * 8, 2 * T * CONV_DIM * 2) == held + T * 512 * 8
    # With mamba_rms_norm, n_groups 1 takes rms_norm_gated's kernel (one bf16 output): the clone is larger.
    assert _peak({**FALCON_H1, "mamba_rms_norm": True}, tuned=True) == held + 2 * T * CONV_DIM * 2
    # NemotronH-style layers (the same mixer sizes) hold two T x hidden tensors and no mup_vector copy.
    granite = {**FALCON_H1, "model_type": "granitemoehybrid", "layer_types": ["mamba"] * 4,
               "architectures": ["GraniteMoeHybridForCausalLM"]}  # fmt: skip
    assert _peak(granite) == 2 * T * 256 * 2 + T * (IN_PROJ + SSM_OUT) * 2 + TRITON_AUTOTUNE_FLUSH_BYTES


def test_the_mup_vector_copy_is_a_phase_that_the_conv_input_copies_exceed() -> None:
    # At `projected_states * mup_vector` both T x in_proj tensors are allocated (ssm_output is not yet).
    # The later phase holds in_proj, ssm_output and the conv input's two copies: larger by
    # ssm_output + 2 x n_groups x state - heads, whatever the sizes (mamba_d_ssm apart from heads x
    # head_dim included), so the peak is the later phase's.
    for over in ({}, {"mamba_d_ssm": 4096, "mamba_n_heads": 2}, {"mamba_n_heads": 64, "mamba_d_head": 8}):
        cfg = {**FALCON_H1, "mamba_rms_norm": True, **over}
        inner, heads, head_dim = cfg["mamba_d_ssm"], cfg["mamba_n_heads"], cfg["mamba_d_head"]
        conv_dim = inner + 2 * 64
        in_proj = inner + conv_dim + heads
        inputs = 4 * T * 256 * 2
        at_multiply = inputs + 2 * T * in_proj * 2
        later = inputs + T * (in_proj + heads * head_dim) * 2 + max(2 * T * conv_dim * 2, T * inner * 2)
        assert at_multiply < later == _peak(cfg, tuned=True), over
