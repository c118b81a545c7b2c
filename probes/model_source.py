"""The drift between a local model source and the copy in [model].dir, by content: called by the
planner for `model.files` when [model] source is set. Reads only (stats, and hashes a file whose
stamp moved since the copy recorded it)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from reconcile.safety.source_content import content_changed, reserved, selected
from reconcile.safety.untrusted import SOURCE_ENTRIES, NotRegular, tree_stat, walk_tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


def source_drift(
    source: str, have: Mapping[str, int], patterns: list[str], hashes: Mapping[str, Any]
) -> list[str]:
    """Source files the copy does not match: absent or of another size in the model dir, or whose
    bytes differ from those recorded at copy (an edit that kept the size). A file only touched
    (same bytes, new stamp) is listed as "NAME (touched)": apply re-records it without copying.
    Without recorded hashes (a copy by an older reconcile) every file counts as unrecorded.
    A source file that is not a regular file (a FIFO, a device, a socket) raises NotRegular naming it
    (relative to the source): apply refuses to copy it, so the plan says so."""
    out = []
    source = _top(source)
    for rel, path, st in _entries(source, patterns):
        if have.get(rel) != st.st_size:
            out.append(rel)
            continue
        changed = content_changed(path, source, hashes.get(rel), st)
        if changed:
            out.append(rel if rel in hashes else f"{rel} (no recorded hash)")
        elif changed is False:
            out.append(f"{rel} (touched)")
    return out


def source_sizes(source: str, patterns: list[str]) -> dict[str, int]:
    """Each source file's size (by apparent size: a sparse file counts whole); NotRegular as above."""
    return {rel: st.st_size for rel, _path, st in _entries(_top(source), patterns)}


def _top(source: str) -> str:
    """The tree the data role reaches (filesafety.data_root: no link followed from a directory of
    another user's on the way), read and hashed by that path, never the one `source` names now; one
    not there is walked as empty."""
    from reconcile.safety.filesafety import UnsafePath, data_root

    try:
        return data_root(source)
    except UnsafePath as exc:
        raise NotRegular(source, str(exc)) from None
    except FileNotFoundError:
        return source


def _entries(source: str, patterns: list[str]) -> Iterator[tuple[str, str, os.stat_result]]:
    for root, dirs, files in walk_tree(source, SOURCE_ENTRIES):
        dirs[:] = sorted(d for d in dirs if d != ".cache")
        for f in sorted(files):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, source).replace(os.sep, "/")
            if reserved(rel) or (patterns and not selected(rel, patterns)):
                continue
            try:  # a FIFO is never opened (it would hang us); a link out of the source never followed
                st = tree_stat(path, source, rel)
            except NotRegular:
                raise
            except OSError:  # gone since the walk
                continue
            yield rel, path, st
