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


def layer_head_dim(config: Mapping[str, Any]) -> int | None:
    """The head size the architecture's vLLM attention computes itself (hidden_size // heads), where
    its code ignores config.json's head_dim; None where it reads the config."""
    _, entry = _entry(config)
    if entry is None or entry.get("layer_head_dim") != "hidden_size // num_attention_heads":
        return None
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None
