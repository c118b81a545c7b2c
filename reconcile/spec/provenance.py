"""Where a spec file may come from: the one reader of the spec, its `extends` bases and its lock.

Called by reconcile.spec.loader, .pins and .cache. Root runs what the spec says, so a spec file is
read only when nobody but root and the user running reconcile can change it (sshd's StrictModes:
the file and every directory above it); `reconcile validate` reads a fleet repository as data and
only inside it (`read_confined`). Either way: a regular file (a FIFO never blocks the read), at
most MAX_BYTES, checked on the descriptor it is read from, never on the name again.
"""

from __future__ import annotations

import errno
import os
import stat

from reconcile.errors import SpecError
from reconcile.safety.filesafety import UnsafePath, owners, parent_problem, walk

MAX_BYTES = 1 << 20  # a spec, a base or a lock larger than 1 MiB is not one a person wrote
FIX = (
    "reconcile reads a spec only when root or the user running it owns it and every directory above "
    "it, and nobody else can write them (sshd's StrictModes): chown root and chmod go-w what it "
    "names, or move the spec under a directory only root can write"
)
OUTSIDE = "outside the repository {root} (validate reads only the repository it checks)"


def spec_file_problem(path: str) -> str | None:
    """Why another user could change what `path` holds (None when only root or we can): sshd's
    StrictModes by filesafety's one walk, every directory from / (links' own directories included: a
    link is followed only from a directory only root or we can write) and the file's owner."""
    return parent_problem(path, follow=True)


def read_trusted(path: str, display: str, *, missing_ok: bool = False, fix: str = FIX) -> bytes | None:
    """The bytes of spec file `path` (named `display` in errors), when only root or we can change it;
    else one SpecError naming the file, what is wrong and the fix. None: absent and `missing_ok`."""
    if missing_ok and not os.path.lexists(path):
        return None
    problem = spec_file_problem(path)
    if problem is not None:
        raise SpecError(display, None, "", f"{problem}: {fix}")
    try:  # the same walk again, for the directory's descriptor: the file is opened relative to it
        w = walk(path, follow_last=True)
    except (UnsafePath, OSError) as exc:  # changed since the check
        raise SpecError(display, None, "", f"{exc}: {fix}") from None
    try:
        if w.st is None:
            raise SpecError(display, None, "", "cannot read (No such file or directory)")
        fd = _open(w.name, display, w.dir_fd, fix)
    finally:
        w.close()
    return _judged(fd, display, trusted=True, fix=fix)


def outside(path: str, root: str) -> bool:
    """Whether `path`, its symlinks resolved, leads out of directory `root`."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, top]) != top


def read_confined(path: str, display: str, root: str, *, missing_ok: bool = False) -> bytes | None:
    """The bytes of `path` read as data (validate), only when it lies in `root` with its symlinks
    resolved; else one SpecError that shows nothing of what lies outside."""
    if outside(path, root):
        raise SpecError(display, None, "", "is " + OUTSIDE.format(root=root))
    if missing_ok and not os.path.lexists(path):
        return None
    return _judged(_open(os.path.realpath(path), display), display, trusted=False)


def _open(name: str, display: str, dir_fd: int | None = None, fix: str = FIX) -> int:
    """`name` opened without following a link put there since, without blocking on a FIFO."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecError(display, None, "", f"became a symlink while it was read: {fix}") from None
        raise SpecError(display, None, "", f"cannot read ({exc.strerror})") from None


def _judged(fd: int, display: str, *, trusted: bool, fix: str = FIX) -> bytes:
    """The descriptor judged (a regular file; with `trusted`, root's or ours and writable by nobody
    else) and read, at most MAX_BYTES; closed."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO"}
            kind = kinds.get(stat.S_IFMT(st.st_mode), "a device or socket")
            raise SpecError(
                display, None, "", f"is not a regular file ({kind}): give the path of a TOML spec file"
            )
        if trusted and st.st_uid not in owners():
            raise SpecError(display, None, "", f"is owned by {_who(st.st_uid)}: {fix}")
        if trusted and st.st_mode & 0o022:
            who = "others" if st.st_mode & 0o002 else "its group"
            raise SpecError(
                display, None, "", f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): {fix}"
            )
        chunks, size = [], 0
        while size <= MAX_BYTES and (chunk := os.read(fd, MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            too_big = f"is larger than {MAX_BYTES >> 20} MiB: not a spec a person wrote"
            raise SpecError(display, None, "", too_big)
        return b"".join(chunks)
    except OSError as exc:
        raise SpecError(display, None, "", f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


def _who(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
