"""The shape of a model as far as memory goes: attention vs Mamba layers, KV heads, head_dim, Mamba dims.

Read from config.json as its transformers config class sees it (engine.families: defaults, Jamba's
`layers_block_type`, NemotronH `hybrid_override_pattern`, `layer_types`, multimodal `text_config`).
Used by `reconcile.vllm.memory` and engine.kvspec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.record import Record
from reconcile.vllm.architectures import latent_cache
from reconcile.vllm.families import layer_geometry, resolve

_ATTENTION = {"*", "attention", "full_attention", "sliding_attention", "chunked_attention", "hybrid"}
_MAMBA = {"m", "mamba", "mamba2", "linear_attention"}
# Mamba-2 dims under each family's names: NemotronH, Granite/Falcon-H1 (mamba_n_heads, mamba_d_head),
# Zamba2 (n_mamba_heads, mamba_headdim, mamba_ngroups), Mamba2ForCausalLM (num_heads, head_dim).
MAMBA2_KEYS = {
    "heads": ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads"),
    "head_dim": ("mamba_head_dim", "mamba_d_head", "mamba_headdim"),
    "state": ("ssm_state_size", "mamba_d_state", "state_size"),
    "groups": ("n_groups", "mamba_n_groups", "mamba_ngroups"),
    "kernel": ("conv_kernel", "mamba_d_conv"),
}


# Mamba-2 inner size (vLLM's get_mamba_state_shape_from_config of each model): NemotronH's is heads x
# head_dim; Granite-4.0-H's, Zamba2's and Mamba2's expand x hidden_size; Falcon-H1's mamba_d_ssm, else
# expand x hidden_size.
_INNER_FROM_EXPAND = {"granitemoehybrid": "mamba_expand", "zamba2": "mamba_expand", "mamba2": "expand",
                      "falcon_h1": "mamba_expand"}  # fmt: skip
# The model types whose vLLM 0.26 code builds MambaMixer2 layers (model_executor/models/*.py).
MIXER2 = frozenset({"nemotron_h", *_INNER_FROM_EXPAND})


class ShapeError(ValueError):
    """config.json lacks what the memory math needs (names the key)."""


class MambaShape(Record):
    layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    ssm_dtype: str | None  # the config's SSM state dtype, where vLLM reads one


class ModelShape(Record):
    """The few numbers of a config.json that size the KV cache and the Mamba state."""

    model_type: str
    hidden_size: int
    layers: int
    attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    vocab_size: int
    layer_source: str  # where the attention/Mamba split came from
    mla_dim: int | None = None  # kv_lora_rank + qk_rope_head_dim (DeepSeek-style latent attention)
    mamba: MambaShape | None = None


def config_int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of `keys` config.json holds as a number (a bool is not one), else `default`."""
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not v >= 1:  # every size or count read here divides or multiplies the memory figures
                raise ShapeError(f"config.json gives {k} {v!r}: a model's sizes and counts are at least 1")
            return int(v)
    if default is None:
        raise ShapeError(f"config.json has none of {', '.join(keys)}")
    return default


def _layer_kinds(cfg: Mapping[str, Any], layers: int) -> tuple[int, int, str]:
    """(attention layers, Mamba layers, source) from NemotronH's pattern or a per-layer type list."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*"), pattern.count("M"), "hybrid_override_pattern"
    for key in ("layers_block_type", "layer_types"):
        kinds = cfg.get(key)
        if isinstance(kinds, list) and kinds:
            names = [str(k).lower() for k in kinds]
            return sum(n in _ATTENTION for n in names), sum(n in _MAMBA for n in names), key
    return layers, 0, "num_hidden_layers"


def _ssm_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The SSM state dtype a config sets and vLLM honours: NemotronH's mamba_ssm_cache_dtype, Qwen3.5's
    mamba_ssm_dtype (float32; seen on vLLM 0.17: a 2,096-token attention block, fp32 state)."""
    mt = str(cfg.get("model_type", ""))
    key = (
        "mamba_ssm_cache_dtype"
        if mt == "nemotron_h"
        else "mamba_ssm_dtype"
        if mt.startswith("qwen3_5")
        else ""
    )
    value = cfg.get(key) if key else None
    return str(value) if isinstance(value, str) else None


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    cfg = resolve(config).config
    layers = config_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = config_int(cfg, "num_attention_heads", "n_head")
    hidden = config_int(cfg, "hidden_size", "d_model", "n_embd")
    attention, mamba_layers, source = _layer_kinds(cfg, layers)
    mla = None
    if latent_cache(cfg):
        mla = int(cfg["kv_lora_rank"]) + config_int(cfg, "qk_rope_head_dim", default=0)
    mamba = None
    if str(cfg.get("model_type", "")).startswith("falcon_h1"):
        mamba_layers = layers  # every Falcon-H1 layer runs attention and Mamba side by side
    if str(cfg.get("model_type", "")) == "zamba2":
        mamba_layers = layers  # every Zamba2 layer has a Mamba mixer; "hybrid" ones attention too
    if mamba_layers:
        # Mamba-1 (Jamba) has no heads; Qwen3-Next's linear attention names its dims differently.
        mamba = MambaShape(
            layers=mamba_layers,
            num_heads=config_int(cfg, *MAMBA2_KEYS["heads"], "linear_num_value_heads", default=0),
            head_dim=config_int(cfg, *MAMBA2_KEYS["head_dim"], "linear_value_head_dim", default=0),
            state_size=config_int(cfg, *MAMBA2_KEYS["state"], "linear_key_head_dim", default=0),
            n_groups=config_int(cfg, *MAMBA2_KEYS["groups"], "linear_num_key_heads", default=1),
            conv_kernel=config_int(
                cfg, *MAMBA2_KEYS["kernel"], "mamba_conv_kernel", "linear_conv_kernel_dim", default=4
            ),
            ssm_dtype=_ssm_dtype(cfg),
        )
    return ModelShape(
        model_type=str(cfg.get("model_type", "")),
        hidden_size=hidden,
        layers=layers,
        attention_layers=attention,
        num_attention_heads=heads,
        num_kv_heads=layer_geometry(cfg)[0]
        or config_int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads),
        # NemotronH: head_dim 128 while hidden_size / heads = 84; the explicit key wins, except where
        # the model's vLLM code ignores it (engine.families.layer_geometry: Cohere2, Qwen2, ...).
        head_dim=layer_geometry(cfg)[1]
        or config_int(cfg, "head_dim", "attention_head_dim", default=hidden // heads),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        vocab_size=config_int(cfg, "vocab_size", default=0),
        layer_source=source,
        mla_dim=mla,
        mamba=mamba,
    )


class Mamba2Dims(Record):
    """A Mamba-2 mixer's sizes, whole model (vLLM's MambaMixer2 arguments)."""

    heads: int
    head_dim: int
    state: int
    groups: int  # n_groups, replicated up to the tensor-parallel size where it does not divide
    config_groups: int  # n_groups as config.json says (Mixer2RMSNormGated's full_n_groups)
    kernel: int
    inner: int  # intermediate_size


def mamba2_dims(cfg: Mapping[str, Any], tp: int) -> Mamba2Dims:
    """Mamba-2 dims under each model's names (Zamba2: n_mamba_heads, mamba_headdim, mamba_ngroups)."""
    mt = str(cfg.get("model_type", ""))
    heads = config_int(cfg, *MAMBA2_KEYS["heads"])
    head_dim = config_int(cfg, *MAMBA2_KEYS["head_dim"])
    groups = config_int(cfg, *MAMBA2_KEYS["groups"], default=1)
    inner = config_int(cfg, "mamba_d_ssm", default=heads * head_dim)
    expand = _INNER_FROM_EXPAND.get(mt)
    if expand and not (mt == "falcon_h1" and isinstance(cfg.get("mamba_d_ssm"), int)):
        inner = int(float(cfg.get(expand) or 2) * config_int(cfg, "hidden_size"))
    return Mamba2Dims(
        heads=heads,
        head_dim=head_dim,
        state=config_int(cfg, *MAMBA2_KEYS["state"]),
        # vLLM replicates groups so each head shard has its group (extra_groups_for_head_shards)
        groups=groups + (tp - groups if groups % tp else 0),
        config_groups=groups,
        kernel=config_int(cfg, *MAMBA2_KEYS["kernel"]),
        inner=inner,
    )
