"""config.json as the model's transformers config class sees it: class defaults and derived properties.

vLLM reads a model's config through transformers' config classes, so a key the file leaves out takes
the class default, and some "keys" (Jamba's `layers_block_type`) are properties computed from others.
`resolve()` fills both in from the table in reconcile/data/model_families.json (each value names the
transformers class and field it comes from). Called by engine.shape, engine.limits and engine.kvspec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from reconcile.record import Record
from reconcile.vllm.architectures import layer_head_dim, layer_kv_heads

# A str, not a pathlib.Path: pathlib (with urllib.parse and ipaddress) costs ~5-9 ms to import.
TABLE_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "data", "model_families.json"
)


class Resolved(Record):
    """The language model's config with defaults and derived values filled in."""

    config: dict[str, Any]
    family: str | None  # the model_type whose table entry applied; None: unknown, read raw
    sources: dict[str, str]  # key -> where its value came from, for every value not in the file


@cache
def table() -> dict[str, Any]:
    with open(TABLE_PATH, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _num(cfg: Mapping[str, Any], key: str) -> int | None:
    v = cfg.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pattern_types(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """`layer_types` from a period rule: a layer is `every` when (i + 1) % period == 0 (Gemma, gpt-oss)."""
    rule = entry["period"]
    if isinstance(cfg.get("layer_types"), list):
        return None
    period = _num(cfg, rule["key"]) if rule.get("key") else None
    period = period or int(rule["default"])
    layers = _num(cfg, "num_hidden_layers") or 0
    every, other = rule["every"], rule["other"]
    cfg["layer_types"] = [every if (i + 1) % period == 0 else other for i in range(layers)]
    return str(rule["source"])


def _qwen_window(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Qwen2/Qwen3: sliding_window is None unless use_sliding_window; layers from max_window_layers slide."""
    rule = entry["qwen_window"]
    if not cfg.get("use_sliding_window"):
        cfg["sliding_window"] = None
    window = cfg.get("sliding_window")
    layers = _num(cfg, "num_hidden_layers") or 0
    start = _num(cfg, "max_window_layers") or 0
    if isinstance(cfg.get("layer_types"), list):
        return str(rule["source"])
    cfg["layer_types"] = [
        "sliding_attention" if window is not None and i >= start else "full_attention" for i in range(layers)
    ]
    return str(rule["source"])


def _jamba_blocks(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Jamba's layers_block_type property: attention where i % attn_layer_period == attn_layer_offset."""
    rule = entry["jamba_blocks"]
    if isinstance(cfg.get("layers_block_type"), list):
        return None
    period = _num(cfg, "attn_layer_period") or 1
    offset = _num(cfg, "attn_layer_offset") or 0
    layers = _num(cfg, "num_hidden_layers") or 0
    cfg["layers_block_type"] = ["attention" if i % period == offset else "mamba" for i in range(layers)]
    return str(rule["source"])


def _granite_blocks(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """GraniteMoeHybrid: `layer_types` of "mamba"/"attention", all mamba when absent."""
    rule = entry["granite_blocks"]
    layers = _num(cfg, "num_hidden_layers") or 0
    if not isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = ["mamba"] * layers
        return str(rule["source"])
    return None


def _interval_types(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Qwen3-Next/Qwen3.5: every full_attention_interval-th layer is full attention, the rest linear."""
    rule = entry["interval"]
    if isinstance(cfg.get("layer_types"), list):
        return None
    interval = _num(cfg, rule["key"]) or int(rule["default"])
    layers = _num(cfg, "num_hidden_layers") or 0
    cfg["layer_types"] = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    return str(rule["source"])


def _llama4_chunks(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Llama 4: vLLM's Llama4Attention reads no_rope_layers, not layer_types: a RoPE layer (1) with an
    attention_chunk_size is chunked local attention, a NoPE layer (0) global. transformers fills an
    empty no_rope_layers with 1 except every no_rope_layer_interval-th layer."""
    rule = entry["llama4_chunks"]
    layers = _num(cfg, "num_hidden_layers") or 0
    rope = cfg.get("no_rope_layers")
    if not isinstance(rope, list) or len(rope) != layers:
        interval = _num(cfg, "no_rope_layer_interval") or int(rule["interval_default"])
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
        cfg["no_rope_layers"] = rope
    chunked = isinstance(cfg.get("attention_chunk_size"), int)
    cfg["layer_types"] = ["chunked_attention" if r and chunked else "full_attention" for r in rope]
    return str(rule["source"])


def _zamba2_blocks(cfg: dict[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Zamba2's layers_block_type: "hybrid" (Mamba + the shared attention block) at hybrid_layer_ids."""
    rule = entry["zamba2_blocks"]
    if isinstance(cfg.get("layers_block_type"), list):
        return None
    ids = cfg.get("hybrid_layer_ids")
    layers = _num(cfg, "num_hidden_layers") or 0
    if not isinstance(ids, list):
        return None
    cfg["layers_block_type"] = ["hybrid" if i in ids else "mamba" for i in range(layers)]
    return str(rule["source"])


def layer_geometry(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(KV heads, head size) of the attention layers where the model's vLLM code computes them itself
    instead of reading config.json (the family's `vllm_layer` rule, else the architecture's in
    engine.architectures); 0 where it reads the config."""
    entry = table()["families"].get(str(cfg.get("model_type", "")))
    rule = entry.get("vllm_layer") if isinstance(entry, Mapping) else None
    if not isinstance(rule, Mapping):
        return layer_kv_heads(cfg) or 0, layer_head_dim(cfg) or 0
    kv = _computed(cfg, str(rule["num_kv_heads"])) if "num_kv_heads" in rule else None
    head = _computed(cfg, str(rule["head_dim"])) if "head_dim" in rule else None
    return kv or 0, head or 0


_DERIVE: Mapping[str, Callable[[dict[str, Any], Mapping[str, Any]], str | None]] = {
    "llama4_chunks": _llama4_chunks,
    "zamba2_blocks": _zamba2_blocks,
    "period": _pattern_types,
    "qwen_window": _qwen_window,
    "jamba_blocks": _jamba_blocks,
    "granite_blocks": _granite_blocks,
    "interval": _interval_types,
}


def text_part(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """(the language model's config, outer model_type): multimodal configs nest it under text_config."""
    outer = str(config.get("model_type", ""))
    nested = config.get("text_config")
    if isinstance(nested, Mapping) and nested:
        merged = dict(nested)
        # The outer config's dtype and quantization apply to the text model too.
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if key in config and key not in merged:
                merged[key] = config[key]
        if "model_type" not in merged:
            inner = table()["text_config_model_type"].get(outer)
            merged["model_type"] = inner or outer
        merged["outer_model_type"] = outer
        return merged, outer
    return dict(config), outer


def resolve(config: Mapping[str, Any]) -> Resolved:
    """config.json's text part with its family's class defaults and derived properties applied."""
    cfg, _ = text_part(config)
    model_type = str(cfg.get("model_type", ""))
    families: Mapping[str, Any] = table()["families"]
    entry = families.get(model_type)
    sources: dict[str, str] = {}
    if entry is None:
        return Resolved(cfg, None, sources)
    for key, spec in entry.get("defaults", {}).items():
        if key not in cfg:
            cfg[key] = spec["value"]
            sources[key] = spec["source"]
    for key, spec in entry.get("derived_defaults", {}).items():
        # None in the file means "computed": head_dim = hidden_size // num_attention_heads and the like.
        if cfg.get(key) is None:
            value = _computed(cfg, spec["from"])
            if value is not None:
                cfg[key] = value
                sources[key] = spec["source"]
    for name in entry.get("derive", ()):
        before = {k: cfg.get(k) for k in ("layer_types", "layers_block_type", "sliding_window")}
        source = _DERIVE[name](cfg, entry)
        for k, old in before.items():
            if source and cfg.get(k) != old:
                sources[k] = source
    _layer_count(cfg, sources, str(entry.get("config_class", model_type)))
    return Resolved(cfg, model_type, sources)


def _layer_count(cfg: dict[str, Any], sources: dict[str, str], config_class: str) -> None:
    """NemotronH's num_hidden_layers is a property (the length of its layer list): transformers 5
    saves config.json without it."""
    if _num(cfg, "num_hidden_layers") is not None:
        return
    for key in ("layers_block_type", "hybrid_override_pattern", "layer_types"):
        value = cfg.get(key)
        if isinstance(value, (list, str)) and value:
            cfg["num_hidden_layers"] = len(value)
            sources["num_hidden_layers"] = (
                f"transformers {config_class}.num_hidden_layers property: len({key})"
            )
            return


def _computed(cfg: Mapping[str, Any], rule: str) -> int | None:
    """The few derived defaults the config classes compute: "a // b" or "a" (copy of another key)."""
    if "//" in rule:
        a, b = (part.strip() for part in rule.split("//"))
        na, nb = _num(cfg, a), _num(cfg, b)
        return na // nb if na is not None and nb else None
    return _num(cfg, rule.strip())
