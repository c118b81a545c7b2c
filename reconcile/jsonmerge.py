"""Merging JSON documents: `[model] config` onto a model's config.json. Pure; imports nothing of ours.

Called by actions.model_config (the write), reconcile.resources.model (the plan) and
reconcile.preflight.gather (the facts the rules read). Dicts merge recursively, any other value
replaces; there is no delete (TOML has no null).
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: `base`'s keys in their order, then the patch's new keys; dicts merge recursively."""
    out = dict(base)
    for key, value in patch.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(old, value)
        else:
            out[key] = plain(value)
    return out


def plain(value: Any) -> Any:
    """Patch values come from frozen spec models: turn mappings/tuples into JSON-ready dicts/lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
