"""The max_model_len vLLM derives from a model's config.json, per vLLM version.

Mirrors `_get_and_verify_max_len` (vllm/config/model.py; facts in vllm-facts.md, "max_model_len").
Used by the preflight's `max-model-len.derived` rule and by the memory math.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from reconcile.record import Record
from reconcile.safety.untrusted import load_json
from reconcile.vllm.families import resolve, text_part
from reconcile.vllm.flags import release

# Checked in this order; the smallest present wins (the order only decides the key named in messages).
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
DEFAULT_MAX_LEN = 2048
# vLLM >= 0.30 stopped scaling the derived length for yarn; 0.12 started reading rope_parameters.
YARN_UNSCALED_FROM = (0, 30, 0)
ROPE_PARAMETERS_FROM = (0, 12, 0)
AUTO_MAX_LEN_FROM = (0, 14, 0)
# transformers' ALLOWED_LAYER_TYPES: a rope_parameters dict keyed by these is per layer type.
_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention", "linear_attention", "hybrid"}
# Rope types vLLM of 0.26 leaves unscaled; others multiply the length by `factor`. An alias such as
# DeepSeek's "deepseek_yarn" is not "yarn" there: max_position_embeddings x factor, no original base.
UNSCALED_ROPE = ("su", "longrope", "llama3")
YARN_ALIASES = ("deepseek_yarn",)
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])\Z")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class MaxLenError(ValueError):
    """A max-model-len value vLLM's parser would reject."""


def human_int(value: object) -> int | None:
    """A flag vLLM parses with human_readable_int ("3G" = 3 x 2**30, "3g" = 3 x 10**9, "4096"); None
    when the value is not one (vllm/utils/argparse_utils.py)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    m = _HUMAN.fullmatch(value.strip())
    if m:
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        return None if "." in number else int(number) * _BINARY[suffix]
    return int(value.strip()) if value.strip().isdigit() else None


def int_flag(value: object) -> int | None:
    """A plain int flag (vLLM's argparse `int`: no "1K" forms), as the spec writes it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def parse_max_model_len(value: object) -> int | None:
    """A spec's max-model-len as vLLM reads it; None for "auto"/-1 (fit to memory).

    vLLM's human_readable_int: lower-case suffixes are decimal ("32k" = 32,000, "1m" =
    1,000,000), upper-case are binary ("32K" = 32,768, "1M" = 1,048,576), no decimals with binary.
    """
    if isinstance(value, bool):
        raise MaxLenError(f"{value!r} is not a length")
    if isinstance(value, int):
        return None if value == -1 else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise MaxLenError(f'{value!r} is not a length (an integer, "32k", "1M" or "auto")')
    text = value.strip()
    if text.lower() == "auto" or text == "-1":
        return None
    m = _HUMAN.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise MaxLenError(
                f"{value!r}: decimals are not allowed with binary suffixes (use {number}{suffix.lower()})"
            )
        return int(number) * _BINARY[suffix]
    if text.isdigit():
        return int(text)
    raise MaxLenError(f'{value!r} is not a length (an integer, "32k", "1M" or "auto")')


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (multimodal configs nest it under text_config)."""
    return text_part(config)[0]


def rope_parameters(config: Mapping[str, Any], version: str | None) -> dict[str, Mapping[str, Any]] | None:
    """The rope dicts vLLM of `version` acts on, keyed by layer type ("" for all layers).

    vLLM >= 0.12 reads `rope_parameters` and converts legacy `rope_scaling` (its "type" key
    becomes "rope_type"); earlier releases read `rope_scaling` only, so a `rope_parameters`
    patch is invisible to them. An unknown version is taken as a recent one.
    """
    rel = release(version) if version else None
    modern = rel is None or rel >= ROPE_PARAMETERS_FROM
    raw = config.get("rope_parameters") if modern else None
    if not raw:
        raw = config.get("rope_scaling")
    if not isinstance(raw, Mapping) or not raw:
        return None
    per_type = raw if set(raw).issubset(_LAYER_TYPES) else {"": raw}
    out: dict[str, Mapping[str, Any]] = {}
    for layer_type, params in per_type.items():
        if not isinstance(params, Mapping):
            continue
        p = dict(params)
        if "rope_type" not in p and "type" in p:
            p["rope_type"] = p["type"]
        p.setdefault("rope_type", "default")
        out[layer_type] = p
    return out or None


class Derived(Record):
    """What vLLM will take as the model's maximum length, and how it got there."""

    value: int  # the limit, rounded down as vLLM's int() does
    raw: float | int  # before rounding, as vLLM prints it in its error ("1048576.0")
    key: str  # the config key it came from ("max_position_embeddings", "sliding_window", ...)
    base: int  # the length before rope scaling
    rope_type: str | None
    factor: float  # the rope factor applied (1.0 when none)
    model_max_length: int | None  # config's model_max_length: a user value up to it is allowed
    note: str  # for humans: "original_max_position_embeddings 262,144 x 4 (yarn)"
    # What vLLM takes when max-model-len is unset: the limit, except LongRoPE models, which default
    # to original_max_position_embeddings (Phi-3 128k: 4,096) to keep short prompts accurate.
    default: int = 0
    default_reason: str = ""

    def vllm_message(self, requested: int) -> str:
        """The line vLLM raises when `requested` is above this limit."""
        return (
            f"User-specified max_model_len ({requested}) is greater than the derived max_model_len "
            f"({self.key}={self.raw} or model_max_length={self.model_max_length} in model's config.json)."
        )

    def allows(self, requested: int) -> bool:
        if requested <= self.raw:
            return True
        return self.model_max_length is not None and requested <= self.model_max_length


def derive_max_model_len(
    config: Mapping[str, Any],
    version: str | None,
    *,
    tokenizer_config: Mapping[str, Any] | None = None,
    disable_sliding_window: bool = False,
) -> Derived:
    """The max_model_len vLLM of `version` derives from `config` (already patched), read with its
    transformers config class's defaults (engine.families)."""
    cfg = resolve(config).config
    derived: float = math.inf
    key = ""
    for k in LENGTH_KEYS:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if v < derived:
                key = k
            derived = min(derived, v)
    mml = cfg.get("model_max_length")
    model_max_length = int(mml) if isinstance(mml, (int, float)) and mml else None
    if model_max_length:
        key, derived = "model_max_length", model_max_length
    window = cfg.get("sliding_window")
    if disable_sliding_window and isinstance(window, int) and window < derived:
        key, derived = "sliding_window", window
    if tokenizer_config and isinstance(tokenizer_config.get("model_max_length"), (int, float)):
        derived = min(derived, tokenizer_config["model_max_length"])
    default_note = ""
    if derived == math.inf:
        derived, key = DEFAULT_MAX_LEN, "default"
        default_note = f"; config.json has no length key, vLLM assumes {DEFAULT_MAX_LEN}"
    base, base_key = int(derived), key
    rope = rope_parameters(cfg, version)
    factor = 1.0
    rope_type: str | None = None
    unscaled = ""
    if rope is not None and "gemma3" not in str(cfg.get("model_type", "")):
        rel = release(version) if version else None
        for params in rope.values():
            rope_type = str(params.get("rope_type"))
            if rope_type in UNSCALED_ROPE:
                continue
            factor = float(params.get("factor", factor))
            if rope_type == "yarn":
                if rel is not None and rel >= YARN_UNSCALED_FROM:
                    factor, unscaled = (
                        1.0,
                        " from vLLM 0.30",
                    )  # the length is max_position_embeddings as written
                elif "original_max_position_embeddings" in params:
                    derived = params["original_max_position_embeddings"]
                    base, base_key = int(derived), "original_max_position_embeddings"
        derived = derived * factor
    note = f"{base_key} {base:,}"
    if factor != 1.0:
        note += f" x {factor:g} ({rope_type})"
        if rope_type in YARN_ALIASES:
            note += "; vLLM treats this alias unlike yarn: no original_max_position_embeddings base"
    elif rope_type:
        note += f" ({rope_type}: not scaled{unscaled})"
    default, default_reason = int(derived), ""
    if rope is not None and any(p.get("rope_type") in ("longrope", "su") for p in rope.values()):
        omp = cfg.get("original_max_position_embeddings")
        if isinstance(omp, (int, float)) and not isinstance(omp, bool):
            default = int(omp)
            default_reason = f"LongRoPE: unset max-model-len is original_max_position_embeddings {default:,}"
    return Derived(
        value=int(derived),
        raw=derived,
        key=key,
        base=base,
        rope_type=rope_type,
        factor=factor,
        model_max_length=model_max_length,
        note=note + default_note,
        default=default,
        default_reason=default_reason,
    )


def auto_supported(version: str | None) -> bool | None:
    """Whether --max-model-len auto / -1 is accepted (0.14.0 on)."""
    rel = release(version) if version else None
    return None if rel is None else rel >= AUTO_MAX_LEN_FROM


def rope_factor_for(requested: int, base: int) -> float:
    """The smallest yarn factor (a multiple of 0.5) whose scaled length covers `requested`."""
    return max(1.0, math.ceil(requested / base * 2) / 2)


def apply_hf_overrides(config: Mapping[str, Any], overrides: object) -> Mapping[str, Any]:
    """config.json as vLLM sees it with --hf-overrides (a dict or its JSON text) merged one level deep."""
    if isinstance(overrides, str):
        try:
            overrides = load_json(overrides)
        except ValueError:
            return config
    if not isinstance(overrides, Mapping):
        return config
    merged = dict(config)
    for key, value in overrides.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = {**old, **value}
        else:
            merged[key] = value
    return merged


def ways_to_extend(d: Derived, requested: int, version: str | None, config: Mapping[str, Any]) -> list[str]:
    """Spec edits that raise the derived limit to `requested`, for this vLLM version and rope setup."""
    rel = release(version) if version else None
    if d.rope_type == "yarn" and d.factor == 1.0 and rel and rel >= YARN_UNSCALED_FROM:
        return [
            "or (vLLM >= 0.30 no longer scales yarn) "
            f"[model] config = {{ max_position_embeddings = {requested} }}"
        ]
    if d.rope_type not in (None, "default"):
        return []
    if "rope_parameters" in text_config(config) and rel and rel < ROPE_PARAMETERS_FROM:
        return [f"or (vLLM {version} reads rope_scaling only) move the rope_parameters dict to rope_scaling"]
    factor = rope_factor_for(requested, d.base)
    return [
        "or extend it with YaRN: [model] config = { rope_parameters = { "
        f'rope_type = "yarn", factor = {factor}, original_max_position_embeddings = {d.base} }} }}'
    ]
