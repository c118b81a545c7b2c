"""Per-user cache files: marshal data in a 0700 directory of this user's, each file 0600.

Called by reconcile.spec.cache. A file is read only when it is a regular
file (never through a symlink) this user owns that nobody else can read or write, in a directory
this user owns that nobody else can enter, reached by a way only root and this user can change (root
with another user's XDG_CACHE_HOME, as sudo -E gives, caches nothing); anything else is a miss.
marshal holds plain containers and scalars only: loading it runs no code, unlike pickle.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat

from reconcile.safety.untrusted import walk_tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_MAX_BYTES = 64 << 20  # an entry larger than this is not one we wrote


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reconcile")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def _trusted(path: str, depth: int = 0) -> str | None:
    """`path` with its symlinks resolved, when nobody but root and this user can change the way to it:
    every directory on it is theirs and writable by nobody else (or sticky), every symlink theirs;
    None otherwise. The part not made yet is kept as it is (`_private_dir` checks again once made).
    Root run with another user's XDG_CACHE_HOME (sudo -E) must not follow what that user put there."""
    if depth > 16:
        return None
    uid = os.getuid()
    at = "/"
    names = os.path.join(os.getcwd(), path).split("/")
    for n, name in enumerate(names):
        if name in ("", "."):
            continue
        if name == "..":
            at = os.path.dirname(at)
            continue
        try:
            st = os.lstat(at)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, uid):
            return None
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return None  # another user may rename what is in it
        step = os.path.join(at, name)
        try:
            link = os.lstat(step)
        except FileNotFoundError:
            return os.path.join(step, *[m for m in names[n + 1 :] if m not in ("", ".")])
        except OSError:
            return None
        if stat.S_ISLNK(link.st_mode):
            if link.st_uid not in (0, uid):
                return None
            try:
                target = os.readlink(step)
            except OSError:
                return None
            resolved = _trusted(os.path.join(at, target), depth + 1)
            if resolved is None:
                return None
            step = resolved
        at = step
    try:
        st = os.lstat(at)
    except FileNotFoundError:
        return at
    except OSError:
        return None
    # Its own mode is the caller's to check (read) or to close (_private_dir).
    return at if st.st_uid in (0, uid) else None


def read(path: str) -> Any:
    """The entry's data, or None: only a regular file of ours, 0600, in a 0700 directory of ours, on a
    way nobody else can change (_trusted)."""
    directory = _trusted(os.path.dirname(path))
    if directory is None:
        return None
    try:
        parent = os.lstat(directory)
        if not stat.S_ISDIR(parent.st_mode) or not _private(parent):
            return None
        fd = os.open(
            os.path.join(directory, os.path.basename(path)),
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,  # a FIFO: a miss, never a hang
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)  # of the file opened, so it cannot be swapped after the check
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > _MAX_BYTES:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return marshal.loads(f.read())
    except Exception:  # a damaged entry is a miss
        return None
    finally:
        if fd != -1:
            os.close(fd)


def _private_dir(directory: str) -> str | None:
    """`directory`'s real path, made (each new level 0700, whatever the umask) or checked to be ours and
    closed to others; None when it is not ours or the way to it is not only ours and root's."""
    real = _trusted(directory)
    if real is None:
        return None
    try:
        made: list[str] = []
        at = real
        while not os.path.lexists(at):
            made.append(at)
            at = os.path.dirname(at)
        for level in reversed(made):
            os.mkdir(level, 0o700)
        if _trusted(real) != real:  # a level made meanwhile by someone else, or a symlink
            return None
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                return None
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o700)  # an older or hand-made dir; the umask may have widened it
        finally:
            os.close(fd)
        return real
    except OSError:
        return None


def write(path: str, data: Any) -> None:
    """Store `data` at `path` (0600, by rename: a reader sees the old file or the new one); a foreign
    or read-only cache dir only costs speed. Data marshal cannot hold is not stored. No fsync: a
    file a crash left short or empty does not load, which is a miss, and a plan is not slowed."""
    directory = _private_dir(os.path.dirname(path))
    if directory is None:
        return
    path = os.path.join(directory, os.path.basename(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError, ValueError):
        body = marshal.dumps(data)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def package_stamps(package: str, names: tuple[str, ...]) -> tuple[tuple[str, int, int, int], ...]:
    """(path, size, mtime, inode) of files of an installed package, found on sys.path without importing
    it: a key part that changes when the package is upgraded or edited."""
    import sys

    for entry in sys.path:
        directory = os.path.join(entry, package)
        if os.path.isfile(os.path.join(directory, "__init__.py")):
            out = []
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(directory, name))
                    out.append((os.path.join(directory, name), st.st_size, st.st_mtime_ns, st.st_ino))
            return tuple(out)
    return ()


def tree_stamps(tops: tuple[str, ...]) -> tuple[tuple[str, int, int, int], ...]:
    """(path, size, mtime, inode) of every file under `tops` (no __pycache__), in one order: a key part
    that changes when reconcile's own code or data is edited or upgraded in place."""
    out: list[tuple[str, int, int, int]] = []
    for top in tops:
        paths = [top] if not os.path.isdir(top) else []
        for directory, dirs, names in walk_tree(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += [os.path.join(directory, n) for n in sorted(names)]
        for path in paths:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def stamp(path: str) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime, ctime) of a file, or None: any write changes the ctime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
