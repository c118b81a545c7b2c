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
from reconcile.safety.filesafety import owners, parent_problem

MAX_BYTES = 1 << 20  # a spec, a base or a lock larger than 1 MiB is not one a person wrote
_MAX_LINKS = 40  # as the kernel's own limit on links in one lookup
FIX = (
    "reconcile reads a spec only when root or the user running it owns it and every directory above "
    "it, and nobody else can write them (sshd's StrictModes): chown root and chmod go-w what it "
    "names, or move the spec under a directory only root can write"
)
OUTSIDE = "outside the repository {root} (validate reads only the repository it checks)"


def spec_file_problem(path: str) -> str | None:
    """Why another user could change what `path` holds (None when only root or we can), by
    filesafety.parent_problem: each symlink on the way must lie in such a directory and be root's or
    ours (a link is followed only then), and the file it leads to is checked the same way."""
    return _checked(path)[0]


def _checked(path: str) -> tuple[str | None, str]:
    """(spec_file_problem's answer, the path with its symlinks resolved: what to open)."""
    links, real = _resolve(os.path.abspath(path))
    if real is None:
        return f"{path}: more than {_MAX_LINKS} symlinks on the way", path
    for link in links:
        if (problem := parent_problem(link)) is not None:
            return problem, real
    return parent_problem(real), real


def _resolve(path: str, depth: int = 0) -> tuple[list[str], str | None]:
    """(each symlink met, where it stands once the part before it is resolved; the real path)."""
    links: list[str] = []
    at = "/"
    for name in path.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            at = os.path.dirname(at)
            continue
        step = os.path.join(at, name)
        if not os.path.islink(step):
            at = step
            continue
        if depth + len(links) >= _MAX_LINKS:
            return links, None
        links.append(step)
        try:
            target = os.readlink(step)
        except OSError:
            at = step  # gone meanwhile: the open below says what is there now
            continue
        more, resolved = _resolve(os.path.join(at, target), depth + len(links))
        links += more
        if resolved is None:
            return links, None
        at = resolved
    return links, at


def read_trusted(path: str, display: str, *, missing_ok: bool = False) -> bytes | None:
    """The bytes of spec file `path` (named `display` in errors), when only root or we can change it;
    else one SpecError naming the file, what is wrong and the fix. None: absent and `missing_ok`."""
    if missing_ok and not os.path.lexists(path):
        return None
    problem, real = _checked(path)
    if problem is not None:
        raise SpecError(display, None, "", f"{problem}: {FIX}")
    return _read(real, display, trusted=True)


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
    return _read(os.path.realpath(path), display, trusted=False)


def _read(real: str, display: str, *, trusted: bool) -> bytes:
    """Open `real` (symlinks already resolved and checked) without following a link put there since,
    without blocking on a FIFO; judge the descriptor; read at most MAX_BYTES."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecError(display, None, "", f"became a symlink while it was read: {FIX}") from None
        raise SpecError(display, None, "", f"cannot read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO"}
            kind = kinds.get(stat.S_IFMT(st.st_mode), "a device or socket")
            raise SpecError(
                display, None, "", f"is not a regular file ({kind}): give the path of a TOML spec file"
            )
        if trusted and st.st_uid not in owners():
            raise SpecError(display, None, "", f"is owned by {_who(st.st_uid)}: {FIX}")
        if trusted and st.st_mode & 0o022:
            who = "others" if st.st_mode & 0o002 else "its group"
            raise SpecError(
                display, None, "", f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): {FIX}"
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
