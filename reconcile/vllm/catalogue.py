"""Configs of well-known models shipped with reconcile, for a preflight before the download.

Called by the planner when the spec's model is not on disk yet: the memory table and the
max-model-len check of the reference deployment can then be shown before 19 GB are fetched.
"""

from __future__ import annotations

import json
import os
from typing import Any

_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "models")


def known_model(repo: str | None) -> dict[str, Any] | None:
    """{"config", "hf_quant_config", "files", "note"} for a packaged repo id, else None."""
    if not repo:
        return None
    path = os.path.join(_DIR, repo.replace("/", "__") + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return data if data.get("repo") == repo else None
