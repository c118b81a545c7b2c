"""Which of the pinned vLLM's text-generation architectures reconcile's KV-cache engine models, from
reconcile/data/vllm_architectures.json (written by tools/vllm_architectures.py from vLLM's registry
and model code). Read by the preflight's memory rule and by engine.families.layer_geometry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from typing import Any

from reconcile.record import Record

TABLE_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "data", "vllm_architectures.json"
)


class Coverage(Record):
    """What the table says of a config's architecture."""

    arch: str | None  # config.json's architectures[0]; None: it names none
    status: str  # "verified" | "modelled" | "not modelled" | "unlisted"
    why: str = ""  # what is not modelled (status "not modelled")
    evidence: tuple[str, ...] = ()  # the oracle rows that check it
    vllm: str = ""  # the release the table was read from

    @property
    def note(self) -> str | None:
        """The memory table's line for an architecture no oracle row has checked."""
        if self.status == "modelled":
            return (
                f"{self.arch}: laid out by the generic rules (full, sliding, chunked or MLA attention); "
                f"no oracle row has checked it against vLLM {self.vllm} yet"
            )
        if self.status == "unlisted" and self.arch:
            return (
                f"{self.arch} is not among vLLM {self.vllm}'s text-generation architectures (multimodal, or "
                "unknown to it): its language model is laid out by the generic rules, unchecked"
            )
        return None


@cache
def table() -> dict[str, Any]:
    with open(TABLE_PATH, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _entry(config: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else None
    entry = table()["architectures"].get(arch) if arch else None
    return arch, entry if isinstance(entry, Mapping) else None


def coverage(config: Mapping[str, Any], text_config: Mapping[str, Any] | None = None) -> Coverage:
    """The architecture's status; "not modelled" too where the config switches on a cache the
    module only builds then (`not_modelled_when`: DeepSeek V3.2's index_topk, HunYuan's use_cla).
    `text_config`: the language model's part, where those keys live (engine.families.text_part)."""
    arch, entry = _entry(config)
    version = str(table().get("vllm", ""))
    if entry is None:
        return Coverage(arch, "unlisted", vllm=version)
    evidence = tuple(str(e) for e in entry.get("evidence", ()))
    inner = text_config if text_config is not None else config
    for key, what in (entry.get("not_modelled_when") or {}).items():
        value = inner.get(key)
        if value not in (None, False, 0, [], {}):
            return Coverage(arch, "not modelled", f"{what} ({key} is set)", evidence, version)
    return Coverage(arch, str(entry["status"]), str(entry.get("why", "")), evidence, version)


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def layer_head_dim(config: Mapping[str, Any]) -> int | None:
    """The head size the architecture's vLLM attention computes itself, where its code ignores
    config.json's head_dim (hidden_size // heads; MiniCPM3's qk_nope + qk_rope); None where it reads
    the config."""
    _, entry = _entry(config)
    rule = entry.get("layer_head_dim") if entry is not None else None
    if rule == "hidden_size // num_attention_heads":
        hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
        return hidden // heads if hidden is not None and heads else None
    if rule == "qk_nope_head_dim + qk_rope_head_dim":
        nope, rope = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim")
        return nope + rope if nope is not None and rope is not None else None
    return None


def layer_kv_heads(config: Mapping[str, Any]) -> int | None:
    """The KV heads the architecture's vLLM attention builds itself (MiniCPM3: one per query head);
    None where it reads num_key_value_heads."""
    _, entry = _entry(config)
    if entry is None or entry.get("layer_kv_heads") != "num_attention_heads":
        return None
    return _int(config, "num_attention_heads")


def latent_cache(config: Mapping[str, Any]) -> bool:
    """vLLM keeps an MLA latent cache (one kv_lora_rank + qk_rope_head_dim vector a token and layer):
    kv_lora_rank is set and the architecture's code builds MLA layers. MiniCPM3 reads kv_lora_rank for
    its projections but builds plain attention (`latent_cache: false` in the table)."""
    if _int(config, "kv_lora_rank") is None:
        return False
    _, entry = _entry(config)
    return entry is None or entry.get("latent_cache") is not False
