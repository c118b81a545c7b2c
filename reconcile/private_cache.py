"""Per-user cache files: marshal data in a 0700 directory of this user's, each file 0600.

Called by reconcile.spec.cache (and reconcile.spec.git_cache). A file is read only when it is a regular
file (never through a symlink) this user owns that nobody else can read or write, in a directory
this user owns that nobody else can enter; anything else, or data that does not load, is a miss.
marshal holds plain containers and scalars only: loading it runs no code, unlike pickle.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
from typing import Any

_MAX_BYTES = 64 << 20  # an entry larger than this is not one we wrote


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reconcile")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def read(path: str) -> Any:
    """The entry's data, or None: only a regular file of ours, 0600, in a 0700 directory of ours."""
    try:
        parent = os.lstat(os.path.dirname(path))
        if not stat.S_ISDIR(parent.st_mode) or not _private(parent):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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


def _private_dir(directory: str) -> bool:
    """Make `directory` (0700, ours) or make sure the one there is ours, then close it to others."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)  # an older or hand-made dir; the umask may have widened it
        return True
    except OSError:
        return False


def write(path: str, data: Any) -> None:
    """Store `data` at `path` (0600, by rename: a reader sees the old file or the new one); a foreign
    or read-only cache dir only costs speed. Data marshal cannot hold is not stored. No fsync: a
    file a crash left short or empty does not load, which is a miss, and a plan is not slowed."""
    if not _private_dir(os.path.dirname(path)):
        return
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


def stamp(path: str) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime, ctime) of a file, or None: any write changes the ctime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
