"""Copying a local model directory into `[model].dir`, by content (a hash recorded at copy decides).

Called by `actions.model.download` for `[model].source`; the manifest stays `actions.model`'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actions.model_config import changed_while_copied, place_source_config
from reconcile.errors import ActionError
from reconcile.host import checkpoint, fsync_dir, remove_stale_temps, temp_prefix
from reconcile.safety.filesafety import ensure_dir
from reconcile.safety.names import is_inside, name_problem
from reconcile.safety.source_content import entry, same_stamp
from reconcile.safety.untrusted import (
    SOURCE_ENTRIES,
    NotRegular,
    copy_fd,
    not_regular,
    open_regular,
    reduced_mode,
    sha256_fd,
    source_roots,
    walk_tree,
)


def source_files(source: str) -> list[str]:
    """Every file below `source`, "/"-separated and sorted; refused (ActionError) when a name holds a
    control character, a symlink leads out of the source, or a file is not a regular file (a FIFO, a
    device, a socket: each would hang or feed the copy), each named."""
    roots = _allowed_roots(source)
    names = []
    for root, dirs, files in walk_tree(source, SOURCE_ENTRIES):
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
        for item in files:
            rel = os.path.normpath(os.path.join(rel_root, item)).replace(os.sep, "/")
            try:
                st = os.stat(os.path.join(root, item))  # an allowed link: what it leads to
            except FileNotFoundError:
                continue  # gone since the listing, or a dangling link: nothing to copy
            if (what := not_regular(st.st_mode)) is not None:
                raise ActionError(_refusal(source, rel, what))
            names.append(rel)
    return sorted(names)


def _refusal(source: str, name: str, what: str) -> str:
    return f"[model].source {source}: {name} is {what}: refused, nothing copied (remove it from the source)"


_allowed_roots = source_roots  # where its links may lead


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

    Each source file is opened once as data (reconcile.safety.untrusted: regular only, non-blocking,
    fstat): its hash, its copy and its record are of that one open file, as big as fstat saw it.
    First the temps a killed copy left: only beside the files it copies, only of those files.
    """
    names, roots = list(names), _allowed_roots(source)
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
        try:
            fd, st = open_source(src, roots)
        except NotRegular as exc:
            raise ActionError(_refusal(source, name, str(exc.strerror))) from None
        try:
            was = recorded.get(name)
            digest: str | None = None  # a first copy: its record is the copy's own hash
            changed: bool | None = True
            if same_stamp(was, st):  # unchanged since the copy `recorded` describes (ctime included)
                changed, digest = None, str(recorded[name]["sha256"])
            elif isinstance(was, Mapping):  # changed, or only touched: its bytes decide
                digest = sha256_fd(fd, st.st_size)
                changed = was.get("sha256") != digest
            done, kept = _copy_one(fd, st, model_dir, name, digest, unchanged=changed is not True)
            if done:
                copied.append(name)
            entries[name] = entry(st, kept)
        except OSError as exc:
            if exc.filename is not None:  # the destination's (ENOSPC names it): shown as it is
                raise
            raise ActionError(f"[model].source {source}: {name}: {exc.strerror}") from None
        finally:
            os.close(fd)
    if copied:
        fsync_dir(model_dir)
    return copied, entries


def open_source(path: str, roots: Sequence[str]) -> tuple[int, os.stat_result]:
    """A source file opened as data: the resolved target, that last step without following a link,
    and the file opened must lie in `roots` (the source, a hub snapshot's blobs): a link its owner
    put in place of a file since source_files listed the tree is refused, not copied."""
    return open_regular(os.path.realpath(path), inside=roots)


def _copy_one(
    src: int, st: os.stat_result, model_dir: str, name: str, digest: str | None, *, unchanged: bool
) -> tuple[bool, str]:
    """Copy the open source file `src` to `name` in the model dir, unless `unchanged` and there at its
    size; returns (copied, the sha256 its record names). The record must name the bytes the copy
    holds: the copy itself, root's temp file, is hashed before it is renamed into place. Where the
    source was hashed first (`digest`: to decide whether to copy), its owner may have written it
    since (the record would then name bytes the copy does not hold, and the store its blob by them):
    other bytes are refused."""
    dst = inside_model_dir(model_dir, name)
    if name == "config.json" and (placed := place_source_config(src, st, model_dir, digest)) is not None:
        return placed
    with contextlib.suppress(FileNotFoundError):
        if unchanged and digest is not None and os.stat(dst).st_size == st.st_size:  # copied last time
            return False, digest
    ensure_dir(os.path.dirname(dst), 0o755)  # one level at a time (os.makedirs recurses)
    # mkstemp: O_EXCL, 0600, named as the stale-temp sweep knows ours
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(dst), suffix=".tmp", dir=os.path.dirname(dst))
    try:
        try:
            os.fchmod(fd, reduced_mode(st.st_mode))  # never setuid, setgid, sticky or writable by others
            copy_fd(src, fd, st.st_size)  # holes kept; stops at the size fstat saw
            held = sha256_fd(fd, st.st_size)
            if digest is not None and held != digest:
                raise ActionError(changed_while_copied(name))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(fd)
        finally:
            os.close(fd)
        checkpoint(f"model.copy:{name}")
        os.replace(tmp, dst)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, exc.strerror, dst) from exc  # the full disk is the destination's
        raise
    return True, held
