"""Copying a local model directory into `[model].dir`, by content (a hash recorded at copy decides).

Called by `actions.model.download` for `[model].source`; the manifest stays `actions.model`'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from actions.model_config import place_source_config
from reconcile.errors import ActionError
from reconcile.host import checkpoint, fsync_dir, remove_stale_temps, temp_prefix
from reconcile.safety.names import is_inside, name_problem
from reconcile.safety.source_content import content_changed, entry, sha256_file


def source_files(source: str) -> list[str]:
    """Every file below `source`, "/"-separated and sorted; refused (ActionError) when a name holds a
    control character or a symlink leads out of the source."""
    roots = _allowed_roots(source)
    names = []
    for root, dirs, files in os.walk(source):
        rel_root = os.path.relpath(root, source)
        if rel_root.split(os.sep)[0] == ".cache":  # huggingface_hub's bookkeeping
            continue
        for item in [*dirs, *files]:
            full = os.path.join(root, item)
            rel = os.path.normpath(os.path.join(rel_root, item)).replace(os.sep, "/")
            if (problem := name_problem(rel)) is not None:
                raise ActionError(f"[model].source {source}: {rel!r} {problem}: rename it or leave it out")
            if os.path.islink(full) and not any(is_inside(full, r) for r in roots):
                raise ActionError(
                    f"[model].source {source}: {rel} is a symlink to {os.path.realpath(full)}, outside the "
                    "source: copy the file in, or remove the link"
                )
        names += [os.path.normpath(os.path.join(rel_root, f)).replace(os.sep, "/") for f in files]
    return sorted(names)


def _allowed_roots(source: str) -> list[str]:
    """Where the source's symlinks may lead: inside it, and for a huggingface_hub cache snapshot
    (<repo>/snapshots/<rev>, every file a link to ../../blobs/...) into that repo's blobs."""
    real = os.path.realpath(source)
    roots = [real]
    if os.path.basename(os.path.dirname(real)) == "snapshots":
        roots.append(os.path.join(os.path.dirname(os.path.dirname(real)), "blobs"))
    return roots


def inside_model_dir(model_dir: str, name: str) -> str:
    """`model_dir`/`name` (a checked name); refused when an existing part of it is a symlink leading out."""
    top = os.path.normpath(model_dir)
    path = os.path.join(top, name)
    parent = os.path.dirname(path)
    while parent != top and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not is_inside(parent, top):
        shown = os.path.relpath(parent, top)
        raise ActionError(
            f"{model_dir}: {shown} leads to {os.path.realpath(parent)} through a symlink, outside the model "
            f"dir: {name} would be written there (remove the link)"
        )
    return path


def copy_files(
    source: str, model_dir: str, names: Iterable[str], recorded: Mapping[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """Copy `names` from `source` into `model_dir` unless provably unchanged since the copy that
    `recorded` describes (source_content: same stamp, or same sha256); returns the names copied
    and each file's new record entry.

    First the temps a killed copy left: only beside the files it copies, only of those files.
    """
    names = list(names)
    by_dir: dict[str, set[str]] = {}
    for name in names:
        by_dir.setdefault(os.path.dirname(os.path.join(model_dir, name)), set()).add(os.path.basename(name))
    for directory, basenames in by_dir.items():
        if is_inside(directory, model_dir):  # else _copy_one refuses the name
            remove_stale_temps(directory, basenames)
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
    dst = inside_model_dir(model_dir, name)
    if name == "config.json" and (placed := place_source_config(src, model_dir)) is not None:
        return placed
    with contextlib.suppress(FileNotFoundError):
        if unchanged and os.stat(dst).st_size == os.stat(src).st_size:  # the bytes copied last time
            return False
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(dst), suffix=".tmp", dir=os.path.dirname(dst))
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        shutil.copystat(src, tmp)
        os.chmod(tmp, os.stat(tmp).st_mode & ~0o022)  # a world-writable source is not copied as one
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        checkpoint(f"model.copy:{name}")
        os.replace(tmp, dst)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # shutil names the source first: the full disk is the destination's
            raise OSError(exc.errno, exc.strerror, dst) from exc
        raise
    return True
