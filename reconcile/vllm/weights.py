"""The weights' size before they are downloaded: a safetensors index's `total_size`, else an estimate
from config.json (parameter count x bytes per parameter for its dtype or quantization).

Called by the preflight's memory rule when the model dir has no weight files yet. The estimate counts
the language model's matrices (embeddings, attention or MLA, MLP or experts, Mamba mixers); norms,
biases and vision towers are left out, so it runs a few percent low.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.record import Record
from reconcile.safety.shapes import SIZE_MAX
from reconcile.vllm.families import resolve
from reconcile.vllm.kvspec import MAMBA, layer_kinds

# Bits one quantized weight takes, scales included (a group's scale spread over its weights).
_QUANT_BITS = {"NVFP4": 4.5, "MXFP4": 4.25, "FP8": 8.0, "INT8": 8.0}
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0}


class WeightsEstimate(Record):
    parameters: int  # estimated, in the language model's matrices
    quantized: int  # of them, those stored at `bits`
    bits: float  # per quantized parameter (16 when unquantized)
    total_bytes: int
    how: str  # "8.03B parameters x 2 B (bfloat16)"


def index_total(index: Mapping[str, Any]) -> int | None:
    """`metadata.total_size` of a model.safetensors.index.json (the bytes of all its shards' tensors)."""
    meta = index.get("metadata")
    total = meta.get("total_size") if isinstance(meta, Mapping) else None
    if not isinstance(total, (int, float)) or isinstance(total, bool):
        return None
    # A size a file can have (shapes.SIZE_MAX): 1e400 (infinity), NaN or a 401-digit integer was
    # int()'s or the memory table's OverflowError on every plan (tenth round).
    return int(total) if 0 < total <= SIZE_MAX else None


def _n(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return default


def _attention(cfg: Mapping[str, Any], hidden: int) -> int:
    heads = _n(cfg, "num_attention_heads", "n_head")
    if isinstance(cfg.get("kv_lora_rank"), int):  # DeepSeek-style latent attention
        rank, rope, nope = _n(cfg, "kv_lora_rank"), _n(cfg, "qk_rope_head_dim"), _n(cfg, "qk_nope_head_dim")
        v_dim, q_rank = _n(cfg, "v_head_dim", default=nope), _n(cfg, "q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        return q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    head_dim = _n(cfg, "head_dim", "attention_head_dim", default=hidden // max(1, heads))
    kv = _n(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
    return 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim


def _mamba(cfg: Mapping[str, Any], hidden: int) -> int:
    heads = _n(cfg, "mamba_num_heads", "num_heads")
    inner = (
        heads * _n(cfg, "mamba_head_dim", "head_dim") or _n(cfg, "mamba_expand", "expand", default=2) * hidden
    )
    groups, state = (
        _n(cfg, "n_groups", "mamba_n_groups", default=1),
        _n(cfg, "ssm_state_size", "mamba_d_state"),
    )
    conv = _n(cfg, "conv_kernel", "mamba_d_conv", default=4)
    xbc = inner + 2 * groups * state
    return hidden * (inner + xbc + heads) + xbc * conv + inner * hidden


def _experts(cfg: Mapping[str, Any]) -> int:
    return _n(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _mlp(cfg: Mapping[str, Any], hidden: int, moe: bool) -> tuple[int, int]:
    """(parameters, of them in experts) of one MLP or MoE block: gate, up and down, or only up and
    down for NemotronH's ungated relu2."""
    mats = 2 if str(cfg.get("mlp_hidden_act", "")).lower() == "relu2" else 3
    dense = mats * hidden * _n(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden)
    experts = _experts(cfg)
    if not moe or not experts:
        return dense, 0
    inter = _n(cfg, "moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    routed = experts * mats * hidden * inter
    shared_inter = _n(cfg, "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    shared = mats * hidden * (shared_inter or _n(cfg, "n_shared_experts") * inter)
    return routed + shared + hidden * experts, routed


def _moe_layer(cfg: Mapping[str, Any], i: int) -> bool:
    """Whether decoder layer i has experts (DeepSeek first_k_dense_replace, Qwen decoder_sparse_step,
    Jamba expert_layer_period/offset; every layer otherwise)."""
    if not _experts(cfg):
        return False
    if i < _n(cfg, "first_k_dense_replace"):
        return False
    step = _n(cfg, "decoder_sparse_step", "expert_layer_period", default=1) or 1
    offset = _n(cfg, "expert_layer_offset", default=step - 1 if "decoder_sparse_step" in cfg else 0)
    return i % step == offset % step


def parameters(config: Mapping[str, Any]) -> tuple[int, int]:
    """(parameters, of them in routed experts) of the language model, from its config."""
    cfg = resolve(config).config
    hidden = _n(cfg, "hidden_size", "d_model", "n_embd")
    vocab = _n(cfg, "vocab_size")
    # Gemma's config classes tie the LM head to the embeddings unless the file says otherwise.
    tied = cfg.get("tie_word_embeddings", str(cfg.get("model_type", "")).startswith("gemma"))
    total = vocab * hidden * (1 if tied is True else 2)
    experts = 0
    pattern = cfg.get("hybrid_override_pattern")
    kinds = layer_kinds(cfg)
    for i, caches in enumerate(kinds):
        letter = pattern[i] if isinstance(pattern, str) and i < len(pattern) else None
        if MAMBA in caches:
            total += _mamba(cfg, hidden)
        if any(k != MAMBA for k in caches):
            total += _attention(cfg, hidden)
        if letter in ("M", "*"):
            continue  # NemotronH: a layer is one block, its MLP (-) or MoE (E) a layer of its own
        moe = letter == "E" if letter is not None else _moe_layer(cfg, i)
        mlp, routed = _mlp(cfg, hidden, moe)
        total, experts = total + mlp, experts + routed
    return total, experts


def _quant_bits(config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None) -> tuple[float, str]:
    qc = config.get("quantization_config") or hf_quant_config
    if not isinstance(qc, Mapping):
        return 16.0, ""
    inner = qc.get("quantization")
    algo = str((inner if isinstance(inner, Mapping) else qc).get("quant_algo") or "").upper()
    method = str(qc.get("quant_method") or "").lower()
    bits = qc.get("bits") or qc.get("w_bit")
    if algo in _QUANT_BITS:
        return _QUANT_BITS[algo], algo
    if method in ("mxfp4", "fp8"):
        return _QUANT_BITS[method.upper()], method
    if isinstance(bits, int) and not isinstance(bits, bool):  # AWQ / GPTQ: a 16-bit scale per group
        return bits + 16 / max(1, int(qc.get("group_size") or 128)), f"{method or 'int'}{bits}"
    return 16.0, ""


def estimate(config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None) -> WeightsEstimate:
    """The weights' bytes from config.json: 16-bit (or the config's dtype) unless quantized; a
    quantized checkpoint keeps embeddings and the LM head in 16 bits."""
    cfg = resolve(config).config
    params, experts = parameters(config)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16").lower()
    width = _DTYPE_BYTES.get(dtype, 2.0)
    bits, name = _quant_bits(config, hf_quant_config)
    if bits >= 16:
        total = int(params * width)
        return WeightsEstimate(
            params, 0, 8 * width, total, f"{params / 1e9:.2f}B parameters x {width:g} B ({dtype})"
        )
    embeddings = _n(cfg, "vocab_size") * _n(cfg, "hidden_size", "d_model") * 2
    # gpt-oss' MXFP4 quantizes only the experts; the other methods every linear layer.
    quantized = experts if name == "mxfp4" else max(0, params - embeddings)
    total = int(quantized * bits / 8 + (params - quantized) * 2)
    how = f"{params / 1e9:.2f}B parameters, {quantized / 1e9:.2f}B of them at {bits:g} bits ({name})"
    return WeightsEstimate(params, quantized, bits, total, how)
