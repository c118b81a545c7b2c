"""Copying a local model directory into `[model].dir`, rsync-style (size and mtime decide).

Called by `actions.model.download` for `[model].source`; the manifest stays `actions.model`'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable

from actions.model_config import place_source_config
from reconcile.host import checkpoint, fsync_dir


def source_files(source: str) -> list[str]:
    """Every file below `source`, "/"-separated and sorted."""
    return sorted(
        os.path.relpath(os.path.join(root, f), source).replace(os.sep, "/")
        for root, dirs, files in os.walk(source)
        if os.path.relpath(root, source).split(os.sep)[0] != ".cache"  # huggingface_hub's bookkeeping
        for f in files
    )


def copy_files(source: str, model_dir: str, names: Iterable[str]) -> list[str]:
    """Copy `names` from `source` into `model_dir` unless size and mtime match; returns those copied."""
    copied = [n for n in names if _copy_one(os.path.join(source, n), model_dir, n)]
    if copied:
        fsync_dir(model_dir)
    return copied


def _copy_one(src: str, model_dir: str, name: str) -> bool:
    dst = os.path.join(model_dir, name)
    if name == "config.json" and (placed := place_source_config(src, model_dir)) is not None:
        return placed
    with contextlib.suppress(FileNotFoundError):
        s, d = os.stat(src), os.stat(dst)
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime):  # rsync's rule, 1 s granularity
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
