"""Real `vllm serve` on tiny random models vs reconcile's prediction (issue 14, b; issue 28).

Dense, MoE, MLA, sliding window, interleaved local/global and a Mamba hybrid (NemotronH, served with
prefix caching off and on: vLLM 0.26's "none" and "all" Mamba cache modes), plus two verdict cases
(a dense model whose derived length does not fit, a sliding-window one that does). Issue 28 adds
Cohere2, Llama 4 text, Granite-4.0-H, Zamba2, NemotronH Nano's 52-layer pattern at 262,144 tokens,
and three verdicts with the cache sized by --kv-cache-memory-bytes (one with CUDA graphs on). Each model is
built offline with transformers, served with --enforce-eager at a small gpu-memory-utilization, and
its log's "Available KV cache memory", "GPU KV cache size: N tokens", attention backend, block size
and Mamba cache mode, or its refusal, set beside reconcile's figures. Resumable per model
(ORACLE_STATE). Writes $OUT/preflight-serve.{json,md}.
Usage: tools/preflight_oracle.sh --serve [--tp N] [names...]; at --tp N > 1 (issue 19: N GPUs, NVLink
multicast off) the files are preflight-serve-tpN.* and each model is kept apart from its TP 1 run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconcile.vllm.attention import Build, scan_build  # noqa: E402
from reconcile.vllm.limits import derive_max_model_len  # noqa: E402
from reconcile.vllm.memory import MemoryEstimate, cuda_total, estimate  # noqa: E402

GiB = 1024**3
UTIL = 0.10
COMMON = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# name -> (transformers config class, its kwargs); every size is the smallest the kernels accept.
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": (
        "LlamaConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "max_position_embeddings": 4096,
        },
    ),
    "moe": (
        "Qwen3MoeConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "max_position_embeddings": 4096,
        },
    ),
    "mla": (
        "DeepseekV2Config",
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "kv_lora_rank": 512,
            "q_lora_rank": None,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 128,
            "first_k_dense_replace": 1,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 4096,
        },
    ),
    "sliding": (
        "MistralConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "sliding_window": 512,
            "max_position_embeddings": 8192,
        },
    ),
    "interleaved": (
        "Gemma3TextConfig",
        {
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "sliding_window": 256,
            "layer_types": ["sliding_attention", "full_attention"] * 3,
            "max_position_embeddings": 8192,
        },
    ),
    "mamba-hybrid": (
        "NemotronHConfig",
        {
            "layers_block_type": ["linear_attention", "full_attention", "linear_attention", "mlp"],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "mamba_num_heads": 8,
            "mamba_head_dim": 32,
            "n_groups": 1,
            "ssm_state_size": 64,
            "use_mamba_kernels": False,
            "conv_kernel": 4,
            "expand": 1,
            "max_position_embeddings": 8192,
        },
    ),
    # Verdicts: 32 KiB a token x 1,048,576 tokens = 32 GiB > 0.1 x 140 GiB: vLLM refuses to start.
    "dense-nofit": (
        "LlamaConfig",
        {
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 1048576,
        },
    ),
    # The same size with a 512-token window: one request keeps ~8.7k tokens a layer, and fits.
    "sliding-fits": (
        "MistralConfig",
        {
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "sliding_window": 512,
            "max_position_embeddings": 1048576,
        },
    ),
}
# Issue 28: architectures the corpus never served, each with the family's own rule.
_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # NemotronH Nano's 52 layers
MODELS.update(
    {
        # Command-R7B's shape: 3 sliding (128) : 1 global, heads from hidden_size (commandr.py).
        "cohere2": (
            "Cohere2Config",
            {
                "num_hidden_layers": 8,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "sliding_window": 128,
                "sliding_window_pattern": 4,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": True,  # commandr.py asserts it
            },
        ),
        # Llama 4 text: RoPE layers chunked (attention_chunk_size), every 4th NoPE and global; MoE.
        "llama4-text": (
            "Llama4TextConfig",
            {
                "num_hidden_layers": 8,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "attention_chunk_size": 1024,
                "intermediate_size_mlp": 512,
                "num_local_experts": 4,
                "num_experts_per_tok": 1,
                "max_position_embeddings": 131072,
            },
        ),
        # Granite-4.0-H: Mamba-2 3:1 with NoPE attention, MoE; Mamba inner size = expand x hidden.
        "granite-h": (
            "GraniteMoeHybridConfig",
            {
                "num_hidden_layers": 8,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "layer_types": ["mamba", "mamba", "mamba", "attention"] * 2,
                "mamba_n_heads": 8,
                "mamba_n_groups": 2,
                "mamba_d_state": 64,
                "mamba_d_conv": 4,
                "mamba_expand": 2,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "shared_intermediate_size": 512,
                "position_embedding_type": "nope",
                "max_position_embeddings": 131072,
            },
        ),
        # Zamba2: a Mamba-2 mixer in every layer, the shared attention block in the "hybrid" ones.
        "zamba2": (
            "Zamba2Config",
            {
                "num_hidden_layers": 6,
                "num_attention_heads": 4,
                "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"],
                "n_mamba_heads": 8,
                "mamba_d_state": 64,
                "mamba_expand": 2,
                "num_mem_blocks": 1,
                "use_mamba_kernels": False,
                "max_position_embeddings": 131072,
            },
        ),
        # NemotronH Nano's 52-layer pattern and Mamba dims at 262,144 tokens on a small budget:
        # 2,096-token blocks, 6 attention + 23 Mamba layers (vLLM pads one: "Add 1 padding layers").
        "nemotronh-pad": (
            "NemotronHConfig",
            {
                "hybrid_override_pattern": _NANO_PATTERN,
                "num_hidden_layers": len(_NANO_PATTERN),
                "num_attention_heads": 32,
                "num_key_value_heads": 2,
                "head_dim": 128,
                "mamba_num_heads": 64,
                "mamba_head_dim": 64,
                "n_groups": 8,
                "ssm_state_size": 128,
                "chunk_size": 128,
                "conv_kernel": 4,
                "expand": 2,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "moe_shared_expert_intermediate_size": 128,
                "mamba_ssm_cache_dtype": "float32",
                "use_mamba_kernels": False,
                "max_position_embeddings": 262144,
            },
        ),
    }
)
# Issue 28, families (tools/vllm_architectures.py): one architecture of each engine path no served row
# checked yet, most informative first (tools/preflight_oracle_lab.sh 28c serves them in this order).
FAMILY_CASES = {
    # Mamba-2 beside attention in every layer; in_proj's output scaled by mup_vector (a second copy).
    "falcon-h1": (
        "FalconH1Config",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "mamba_d_ssm": 512,
            "mamba_n_heads": 8,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
            "mamba_chunk_size": 256,
            "ssm_multipliers": [1.0, 0.5, 0.25, 0.25, 2.0],
            "max_position_embeddings": 8192,
        },
    ),
    # Gated delta-net linear attention, every 4th layer full attention; MoE.
    "qwen3-next": (
        "Qwen3NextConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128,
            "max_position_embeddings": 8192,
        },
    ),
    # Mamba-1 layers between attention layers (attn_layer_period / offset); MoE every 2nd layer.
    "jamba": (
        "JambaConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 16,
            "use_mamba_kernels": False,
            "max_position_embeddings": 8192,
        },
    ),
    # MLA without MoE (FlashMLA's shapes: kv_lora_rank 512, rope 64).
    "minicpm3": (
        "MiniCPM3Config",
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "kv_lora_rank": 512,
            "q_lora_rank": 256,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "max_position_embeddings": 4096,
        },
    ),
    # MLA with MoE whose attention reads its heads from the config (glm4_moe_lite.py).
    "glm4-moe-lite": (
        "Glm4MoeLiteConfig",
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "kv_lora_rank": 512,
            "q_lora_rank": 256,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 4096,
        },
    ),
    # Window per layer (3 sliding 128 : 1 global) with MoE.
    "cohere2-moe": (
        "Cohere2MoeConfig",
        {
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "sliding_window": 128,
            "sliding_window_pattern": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    # One sliding window on every layer, MoE.
    "phimoe": (
        "PhimoeConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "sliding_window": 512,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 8192,
        },
    ),
    # Qwen3's own window rule: use_sliding_window, layers from max_window_layers slide (all of them:
    # vLLM's Qwen2Model refuses a mix, "Sliding window for some but all layers is not supported").
    "qwen3-sliding": (
        "Qwen3Config",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "use_sliding_window": True,
            "sliding_window": 512,
            "max_window_layers": 0,
            "max_position_embeddings": 8192,
        },
    ),
    # vLLM's Transformers backend; one KV head (multi-query), GPT-2 key names.
    "gptbigcode-tf": (
        "GPTBigCodeConfig",
        {"n_layer": 4, "n_head": 4, "n_positions": 4096, "multi_query": True, "tie_word_embeddings": True},
    ),
    # Heads from hidden_size (qwen2.py ignores head_dim), full attention, dense.
    "qwen2-heads": (
        "Qwen2Config",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 8192,
        },
    ),
    # Full attention, dense, GPT-2 key names (n_embd, n_head, n_layer), learned positions.
    "gpt2": ("GPT2Config", {"n_layer": 4, "n_head": 4, "n_positions": 4096, "tie_word_embeddings": True}),
    # Heads from hidden_size with MoE and a shared expert.
    "qwen2-moe": (
        "Qwen2MoeConfig",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 256,
            "max_position_embeddings": 8192,
        },
    ),
}
MODELS.update(FAMILY_CASES)
# The same tiny NemotronH with --enable-prefix-caching: vLLM 0.26 keeps its Mamba state per block
# ("all" mode: attention blocks of whole SSD chunks, as many Mamba blocks as attention blocks), the
# mode the reference spec's 7.52 GiB/GPU comes from.
# Verdicts with the KV cache sized by --kv-cache-memory-bytes (vLLM then ignores the utilization):
# the dense model's 4,096 tokens (8 MiB) against 4 MiB and 64 MiB, and the NemotronH with CUDA graphs
# on, where 6 MiB holds one request but fewer Mamba blocks than the default max-num-seqs.
SAME_MODEL = {
    "mamba-hybrid-pc": "mamba-hybrid",
    "dense-kvbytes-nofit": "dense",
    "dense-kvbytes-fits": "dense",
    "mamba-kvbytes-graphs": "mamba-hybrid",
}
SERVE_ARGS: dict[str, dict[str, Any]] = {
    "mamba-hybrid-pc": {"enable-prefix-caching": True},
    "dense-kvbytes-nofit": {"kv-cache-memory-bytes": "4M"},
    "dense-kvbytes-fits": {"kv-cache-memory-bytes": "64M"},
    "mamba-kvbytes-graphs": {"kv-cache-memory-bytes": "6M", "enforce-eager": False},
    "nemotronh-pad": {"gpu-memory-utilization": 0.03},
}
for _name, _base in SAME_MODEL.items():
    MODELS[_name] = MODELS[_base]

ARCH = {
    "LlamaConfig": "LlamaForCausalLM",
    "Qwen3MoeConfig": "Qwen3MoeForCausalLM",
    "DeepseekV2Config": "DeepseekV2ForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Gemma3TextConfig": "Gemma3ForCausalLM",
    "NemotronHConfig": "NemotronHForCausalLM",
    "Cohere2Config": "Cohere2ForCausalLM",
    "Llama4TextConfig": "Llama4ForCausalLM",
    "GraniteMoeHybridConfig": "GraniteMoeHybridForCausalLM",
    "Zamba2Config": "Zamba2ForCausalLM",
    "FalconH1Config": "FalconH1ForCausalLM",
    "Qwen3NextConfig": "Qwen3NextForCausalLM",
    "JambaConfig": "JambaForCausalLM",
    "MiniCPM3Config": "MiniCPM3ForCausalLM",
    "Glm4MoeLiteConfig": "Glm4MoeLiteForCausalLM",
    "Cohere2MoeConfig": "Cohere2MoeForCausalLM",
    "PhimoeConfig": "PhiMoEForCausalLM",
    "Qwen3Config": "Qwen3ForCausalLM",
    "GPTBigCodeConfig": "GPTBigCodeForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
    "GPT2Config": "GPT2LMHeadModel",
    "Qwen2MoeConfig": "Qwen2MoeForCausalLM",
}
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def build(name: str, out: Path) -> None:
    """A random model of `name`'s shape and a tiny byte-level BPE tokenizer, saved to `out`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        ["a tiny model for checking vLLM's KV cache size", "0123456789 abc xyz"] * 20, trainer
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)
    cls_name, kwargs = MODELS[name]
    ids = {
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    config = getattr(transformers, cls_name)(**{**COMMON, **kwargs, **ids})
    config.architectures = [ARCH[cls_name]]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes transformers' class name (PhimoeForCausalLM); a real checkpoint names
    # vLLM's (PhiMoEForCausalLM), and vLLM falls back to its Transformers backend for any other.
    saved = json.loads((out / "config.json").read_text())
    saved["architectures"] = [ARCH[cls_name]]
    (out / "config.json").write_text(json.dumps(saved, indent=2))


SERVED_KEYS = ("started", "refused_kv", "logged_tokens", "available_gib", "seconds", "tail", "logged_backend",
               "logged_block_size", "logged_mamba_mode", "logged_lines", "refused_mamba",
               "logged_peak_activation_gib", "logged_non_torch_gib")  # fmt: skip


# Issue 19: on the two-GPU lab kind NVLink multicast must stay off (shared/gpu-lab/README.md).
MULTI_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def serve(
    model: Path, port: int, log: Path, flags: dict[str, Any], timeout: float = 180, tp: int = 1
) -> dict[str, Any]:
    """Start `vllm serve`, wait until it is up or has exited, stop it; what its log says."""
    eager = flags.get("enforce-eager", True) is not False
    util = flags.get("gpu-memory-utilization", UTIL)
    skip = ("enforce-eager", "gpu-memory-utilization")
    extra = [f"--{k}" if v is True else f"--{k}={v}" for k, v in flags.items() if k not in skip]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        *(["--enforce-eager"] if eager else []),
        "--gpu-memory-utilization",
        str(util),
        *(["--tensor-parallel-size", str(tp)] if tp > 1 else []),
        *extra,
    ]
    env = {**os.environ, **OFFLINE, **(MULTI_GPU_ENV if tp > 1 else {})}
    # A Triton cache of its own, empty: vLLM caches autotuning on disk (TRITON_CACHE_AUTOTUNING=1), so
    # a model whose SSD kernel keys an earlier case tuned skipped the 256 MiB the tuning takes (zamba2
    # after granite-h, issue 28). The plan counts a first start (engine.budget.mamba2_profile_peak).
    triton = log.parent / "triton" / log.stem
    shutil.rmtree(triton, ignore_errors=True)
    env["TRITON_CACHE_DIR"] = str(triton)
    started = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    up = False
    try:
        while time.monotonic() - started < timeout:
            text = log.read_text(errors="replace")
            if "Application startup complete" in text:
                up = True
                break
            if proc.poll() is not None:
                break
            time.sleep(1)
    finally:  # also when the call's `timeout` stops this script (SIGTERM -> SystemExit, see main)
        seconds = time.monotonic() - started
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    text = log.read_text(errors="replace")
    tokens = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
    avail = re.findall(r"Available KV cache memory: ([\d.]+) GiB", text)
    backend = re.findall(r"Using (\w+) attention backend", text)
    # Platform.update_block_size_for_backend: phase 1 (a backend's own block) and the hybrid alignment
    block = re.findall(r"Setting (?:kv cache|attention) block size to (\d+)", text)
    mode = re.findall(r"Mamba cache mode is set to '(\w+)'|Prefix caching in Mamba cache '(\w+)'", text)
    # The profile's split (gpu_worker: "Actual usage is W GiB for weight, A GiB for peak activation, ..."):
    # a Mamba-2 model's peak depends on whether Triton autotuned its SSD kernels (engine.budget).
    peak = re.findall(r"([\d.]+) GiB for peak activation, ([\d.]+) GiB for non-torch memory", text)
    # What vLLM says of its layout and its refusals, kept whole for the report (issue 28).
    said = [
        line.split("] ", 1)[-1][:300]
        for line in text.splitlines()
        if re.search(
            r"padding layers|Padding mamba page|Maximum concurrency|block size to|KV cache is needed|"
            r"exceeds available Mamba|Hybrid KV cache manager|kv_cache_memory_bytes config|Error|error:",
            line,
        )
    ][-20:]
    return {
        "logged_lines": said,
        "logged_backend": backend[-1] if backend else None,
        # No line is no evidence: the tiny NemotronH without prefix caching logs none, yet its capacity
        # from the logged memory needs reconcile's 144-token pages (0.26.0 on the H200, 2026-12-01).
        "logged_block_size": int(block[-1]) if block else None,
        "logged_mamba_mode": next((a or b for a, b in reversed(mode)), None),
        "started": up,
        "refused_kv": "larger than the available KV cache memory" in text,
        "refused_mamba": "exceeds available Mamba cache" in text,
        "logged_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
        "available_gib": float(avail[-1]) if avail else None,
        "logged_peak_activation_gib": float(peak[-1][0]) if peak else None,
        "logged_non_torch_gib": float(peak[-1][1]) if peak else None,
        "seconds": round(seconds, 1),
        "tail": text[-1500:] if not up else "",
    }


# The H200's compute capability and the MLA kernels of the vLLM on sys.path (main sets them).
HOST: dict[str, Any] = {"capability": None, "build": None}


def _estimate(model: Path, total: int, name: str, tp: int = 1) -> MemoryEstimate:
    config = json.loads((model / "config.json").read_text())
    files = {p.name: p.stat().st_size for p in model.iterdir() if p.is_file()}
    flags = SERVE_ARGS.get(name, {})
    length = flags.get("max-model-len") or derive_max_model_len(config, "0.26.0").default
    build: Build | None = HOST["build"]
    return estimate(
        config,
        None,
        files,
        tp=tp,
        total_bytes=total,
        gpu="NVIDIA H200",
        utilization=float(flags.get("gpu-memory-utilization", UTIL)),
        max_model_len=length,
        args={"enforce-eager": True, **flags},
        capability=HOST["capability"],
        build=build,
    )


def predict(model: Path, total: int, name: str, tp: int = 1) -> dict[str, Any]:
    e = _estimate(model, total, name, tp)
    # A verdict is vLLM's: one request fits, and with CUDA graphs each of max-num-seqs has a Mamba block.
    mamba = e.layout is not None and any(g.kind == "mamba" for g in e.layout.groups)
    graphs = SERVE_ARGS.get(name, {}).get("enforce-eager", True) is False
    blocks = e.layout.num_blocks(e.available_for_cache) if e.layout is not None else 0
    starts = e.fits and not (mamba and graphs and e.max_num_seqs > blocks)
    return {
        "starts": starts,
        "padding_layers": e.layout.padding_layers if e.layout is not None else 0,
        "groups": len(e.layout.groups) if e.layout is not None else 0,
        "backend": e.attention_backend.name if e.attention_backend else None,
        "block_size": e.layout.min_block_size if e.layout else None,
        "mamba_mode": e.mamba_mode,
        "max_model_len": e.max_model_len,
        "fits": e.fits,
        "predicted_tokens": e.kv_capacity_tokens,
        "available_predicted_gib": round(e.available_for_cache / GiB, 2),
        "one_request_gib": round(e.one_request / GiB, 3),
        "kv_bytes_per_token": e.kv_per_token,
    }


def layout_tokens(model: Path, total: int, available_gib: float, name: str, tp: int = 1) -> int:
    """Reconcile's block math alone, on the memory vLLM logged as available (rounded to 0.01 GiB)."""
    e = _estimate(model, total, name, tp)
    if e.layout is None:
        return 0
    return e.layout.capacity_tokens(
        int(available_gib * GiB), e.max_model_len, e.in_flight_tokens, e.mamba_mode
    )


def gpu_total() -> int:
    """CUDA's total from NVML (total less the driver's reserve), without a CUDA context here; also
    sets HOST: GPU 0's compute capability and scan_build of sys.path (what the plan would read)."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    HOST["capability"], HOST["build"] = int(major) * 10 + int(minor), scan_build([p for p in sys.path if p])
    m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    return cuda_total(int(m.total), int(m.reserved))


def main(argv: list[str]) -> int:
    tp = 1
    if "--tp" in argv:
        at = argv.index("--tp")
        tp, argv = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    tag = f"-tp{tp}" if tp > 1 else ""
    out_dir = Path(os.environ.get("OUT") or ".")
    state = Path(os.environ.get("ORACLE_STATE", "/tmp/preflight-oracle")) / f"serve{tag}"
    state.mkdir(parents=True, exist_ok=True)
    total = gpu_total()
    # A timed-out call (`timeout` sends SIGTERM) stops the serve in flight and keeps the rows it finished:
    # the report files are rewritten after every row.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(argv or list(MODELS)):
        try:
            row = case(name, i, state, out_dir, total, tp)
        except Exception as e:  # one case the tool cannot build or predict must not lose the others
            row = {"name": name, "tp": tp, "error": f"{type(e).__name__}: {e}"[:500]}
            print(json.dumps(row), flush=True)
        rows.append(row)
        report(rows, total, tp, out_dir)
    print(report(rows, total, tp, out_dir))
    return 0 if all(r.get("verdict_agrees") and r.get("layout_agrees") for r in rows) else 1


def case(name: str, i: int, state: Path, out_dir: Path, total: int, tp: int) -> dict[str, Any]:
    """One case: build its model (once), serve it (once: kept in `state`), set reconcile's figures beside."""
    done = state / f"{name}.json"
    model = state / "models" / SAME_MODEL.get(name, name)
    if not (model / "config.json").exists():
        build(SAME_MODEL.get(name, name), model)
    # Resumable: what vLLM logged is kept per model; reconcile's prediction is made afresh.
    flags = SERVE_ARGS.get(name, {})
    logged = (
        json.loads(done.read_text())
        if done.exists()
        else serve(model, 8300 + i, state / f"{name}.log", flags, tp=tp)
    )
    row: dict[str, Any] = {"name": name, "tp": tp, "flags": flags, **predict(model, total, name, tp)}
    row.update({k: logged.get(k) for k in SERVED_KEYS})
    if row["available_gib"] is not None:
        row["layout_tokens"] = layout_tokens(model, total, row["available_gib"], name, tp)
    logged, predicted = row["logged_tokens"], row["predicted_tokens"]
    row["capacity_error_pct"] = round(100 * (predicted - logged) / logged, 2) if logged else None
    row["verdict_agrees"] = row["starts"] == row["started"]
    # What re-predicting off the lab needs: the model's config.json and its files' sizes.
    row["config"] = json.loads((model / "config.json").read_text())
    row["file_sizes"] = {p.name: p.stat().st_size for p in model.iterdir() if p.is_file()}
    if (state / f"{name}.log").exists():
        logs = out_dir / "serve-logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{name}.log").write_text((state / f"{name}.log").read_text(errors="replace")[-200_000:])
    # What the capacity rests on: the block size (MLA: the backend's), and a hybrid's Mamba mode.
    row["layout_agrees"] = row["logged_block_size"] in (None, row["block_size"]) and (
        row["logged_mamba_mode"] is None or row["mamba_mode"] == row["logged_mamba_mode"]
    )
    print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    done.write_text(json.dumps(row, indent=1))
    return row


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def report(rows: list[dict[str, Any]], total: int, tp: int, out_dir: Path) -> str:
    """$OUT/preflight-serve{-tpN}.{json,md} of the rows so far (each file replaced whole)."""
    tag = f"-tp{tp}" if tp > 1 else ""
    lines = [
        f"vLLM 0.26.0 serve, --enforce-eager, gpu-memory-utilization {UTIL}, tensor-parallel-size {tp}, "
        f"CUDA total {total / GiB:.2f} GiB",
        "",
        "| model | max_model_len | fits (rec.) | started (vLLM) | KV tokens logged | predicted | error | "
        "from logged memory | available GiB logged / pred. | block logged / pred. | Mamba mode | backend |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | tool error: {r['error'][:200]} |" + " |" * 10)
            continue
        lines.append(
            f"| {r['name']} | {r['max_model_len']:,} | {r['starts']} | {r['started']} | "
            f"{r['logged_tokens']} | "
            f"{r['predicted_tokens']:,} | {r['capacity_error_pct']}% | {r.get('layout_tokens')} | "
            f"{r['available_gib']} / {r['available_predicted_gib']} | "
            f"{r['logged_block_size']} / {r['block_size']} | {r['logged_mamba_mode']} / {r['mamba_mode']} | "
            f"{r['logged_backend']} / {r['backend']} |"
        )
    _write(out_dir / f"preflight-serve{tag}.json", json.dumps({"cuda_total": total, "rows": rows}, indent=1))
    _write(out_dir / f"preflight-serve{tag}.md", "\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
