"""The drift between a local model source and the copy in [model].dir, by content: called by the
planner for `model.files` when [model] source is set. Reads only (stats, and hashes a file whose
stamp moved since the copy recorded it)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from reconcile.safety.source_content import content_changed, selected

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def source_drift(
    source: str, have: Mapping[str, int], patterns: list[str], hashes: Mapping[str, Any]
) -> list[str]:
    """Source files the copy does not match: absent or of another size in the model dir, or whose
    bytes differ from those recorded at copy (an edit that kept the size). A file only touched
    (same bytes, new stamp) is listed as "NAME (touched)": apply re-records it without copying.
    Without recorded hashes (a copy by an older reconcile) every file counts as unrecorded."""
    out = []
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d != ".cache")
        for f in sorted(files):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, source)
            if patterns and not selected(rel, patterns):
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            if have.get(rel) != st.st_size:
                out.append(rel)
                continue
            changed = content_changed(path, hashes.get(rel), st)
            if changed:
                out.append(rel if rel in hashes else f"{rel} (no recorded hash)")
            elif changed is False:
                out.append(f"{rel} (touched)")
    return out
