"""Copying a local model directory into `[model].dir`, by content (a hash recorded at copy decides).

Called by `actions.model.download` for `[model].source`; the manifest stays `actions.model`'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from actions.model_config import place_source_config
from reconcile.host import checkpoint, fsync_dir
from reconcile.source_content import content_changed, entry, sha256_file


def source_files(source: str) -> list[str]:
    """Every file below `source`, "/"-separated and sorted."""
    return sorted(
        os.path.relpath(os.path.join(root, f), source).replace(os.sep, "/")
        for root, dirs, files in os.walk(source)
        if os.path.relpath(root, source).split(os.sep)[0] != ".cache"  # huggingface_hub's bookkeeping
        for f in files
    )


def copy_files(
    source: str, model_dir: str, names: Iterable[str], recorded: Mapping[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """Copy `names` from `source` into `model_dir` unless provably unchanged since the copy that
    `recorded` describes (source_content: same stamp, or same sha256); returns the names copied
    and each file's new record entry."""
    copied: list[str] = []
    entries: dict[str, Any] = {}
    for name in names:
        src = os.path.join(source, name)
        st = os.stat(src)
        changed = content_changed(src, recorded.get(name), st)
        digest = recorded[name]["sha256"] if changed is None else sha256_file(src)
        entries[name] = entry(st, digest)
        if _copy_one(src, model_dir, name, unchanged=changed is not True):
            copied.append(name)
    if copied:
        fsync_dir(model_dir)
    return copied, entries


def _copy_one(src: str, model_dir: str, name: str, *, unchanged: bool) -> bool:
    dst = os.path.join(model_dir, name)
    if name == "config.json" and (placed := place_source_config(src, model_dir)) is not None:
        return placed
    with contextlib.suppress(FileNotFoundError):
        if unchanged and os.stat(dst).st_size == os.stat(src).st_size:  # the bytes copied last time
            return False
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".tmp", dir=os.path.dirname(dst))
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        shutil.copystat(src, tmp)
        os.chmod(tmp, os.stat(tmp).st_mode & ~0o022)  # a world-writable source is not copied as one
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        checkpoint(f"model.copy:{name}")
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True
