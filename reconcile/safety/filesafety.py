"""Paths root writes or trusts: sshd's StrictModes check of their parents, a no-symlink mkdir/open
chain, private state (0700 dirs, 0600 files whatever the umask), and the umask for built trees.

Called by the path preflight rule (reconcile.preflight.paths), the state and report writers, and the
actions that open the server's log and build the venv and the model dir.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection, Iterator

from reconcile.errors import ReconcileError

PRIVATE_DIR = 0o700  # state_dir, generations/: only root (or the deployment user) reads them
PRIVATE_FILE = 0o600  # every state file: generations, reports, the index
STATE_UMASK = 0o077  # what the CLI runs under: anything it creates without a mode is private
TREE_UMASK = 0o022  # the venv and the model dir: readable by the server's user, writable by none else


class UnsafePath(ReconcileError):
    """A path whose parents another user can write, or a symlink where a real file or dir must be."""


def owners(extra: Collection[int] = ()) -> frozenset[int]:
    """Who may own what we write or trust: root, the user reconcile runs as, and `extra` (e.g. the
    API key's owner, for the key's own directory)."""
    return frozenset({0, os.geteuid(), *extra})


def _who(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


SYSTEM_GID_MAX = 999  # Debian's and Ubuntu's system groups (adduser.conf's LAST_SYSTEM_GID)


def _system_group_dir(st: os.stat_result) -> bool:
    """Ubuntu's /var/log is root:syslog 0775: a directory of root's that only a system group (its
    members are daemons an administrator chose) may write, and others may not, is trusted above the
    path's own directory, as the distribution itself trusts it. Never as the path's own directory."""
    return st.st_uid == 0 and not st.st_mode & 0o002 and st.st_gid <= SYSTEM_GID_MAX


def parent_problem(path: str, allowed: Collection[int] | None = None) -> str | None:
    """Why another user could swap or plant `path` (None when nobody else can), by sshd's StrictModes
    rule: each existing directory above it (symlinks resolved) is owned by root or us and is not
    group/other-writable; a sticky world-writable directory (/tmp) is allowed only above a directory
    of ours, never as the path's own directory. An existing `path` must be owned by one of them too."""
    ok = owners() if allowed is None else frozenset(allowed)
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    while not os.path.lexists(parent) and parent != "/":  # what we will create is ours
        parent = os.path.dirname(parent)
    real = os.path.realpath(parent)
    # The path's own directory, if it exists; else we make it, and its parent may be sticky.
    own_dir = real if parent == os.path.dirname(path) else None
    chain = [real]
    while chain[-1] != "/":
        chain.append(os.path.dirname(chain[-1]))
    for directory in chain:  # from the path's own directory up to /
        try:
            st = os.stat(directory)
        except OSError as exc:
            return f"{directory}: cannot check it ({exc.strerror})"
        if not stat.S_ISDIR(st.st_mode):
            return f"{directory} is not a directory"
        if st.st_uid not in ok:
            return f"{directory} is owned by {_who(st.st_uid)}, who could replace what is in it"
        if st.st_mode & 0o022:
            sticky = bool(st.st_mode & stat.S_ISVTX)
            if _system_group_dir(st) and directory != own_dir:
                continue
            if not sticky or directory == own_dir:
                what = "world" if st.st_mode & 0o002 else f"group-{_group(st.st_gid)}"
                mode = stat.S_IMODE(st.st_mode)
                return f"{directory} is {what}-writable (mode {mode:04o}): others can plant or swap files"
    try:
        own = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot check it ({exc.strerror})"
    if own.st_uid not in ok:
        return f"{path} is owned by {_who(own.st_uid)}, not by root or the user reconcile runs as"
    return None


def check_parents(path: str, what: str, allowed: Collection[int] | None = None) -> None:
    """Raise UnsafePath (naming `what`, the directory and the fix) when parent_problem() finds one."""
    problem = parent_problem(path, allowed)
    if problem is not None:
        raise UnsafePath(f"{what} {path}: {problem}; {FIX}")


FIX = "move it under a directory only root can write (/var/lib, /srv, /opt) or fix that directory's mode"


def _walk(path: str, mode: int, *, create: bool) -> int:
    """An fd of directory `path`, each component opened with O_NOFOLLOW below the resolved part
    that exists and was checked; missing components are made with `mode` (then chmod: no umask)."""
    path = os.path.abspath(path)
    existing = path
    while not os.path.lexists(existing) and existing != "/":
        existing = os.path.dirname(existing)
    rest = os.path.relpath(path, existing).split(os.sep) if existing != path else []
    where = os.path.realpath(existing)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise UnsafePath(f"{where} is not a directory: move it aside or choose another path") from None
    try:
        for name in rest:
            made = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
                    made = True
            where = os.path.join(where, name)
            try:
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{where} is a symlink or not a directory: {FIX}") from None
                raise
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if made:
                os.fchmod(fd, mode)  # mkdir's mode went through the umask
            elif st.st_uid not in owners() or st.st_mode & 0o022:  # appeared since we looked: whose?
                raise UnsafePath(f"{where} appeared, owned by {_who(st.st_uid)}: {FIX}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_dir(path: str, mode: int = PRIVATE_DIR) -> None:
    """Make directory `path` (and what is missing above it, with `mode`) without following a symlink
    planted below the part that existed; `path` itself ends with exactly `mode` when it is PRIVATE_DIR
    (state must stay private whatever made it first), else is only stripped of group/other write.
    A `path` another user could swap (parent_problem) is an UnsafePath: nothing is made there."""
    check_parents(path, "directory")
    fd = _walk(path, mode, create=True)
    try:
        st = os.fstat(fd)
        want = mode if mode == PRIVATE_DIR else stat.S_IMODE(st.st_mode) & ~0o022
        if stat.S_IMODE(st.st_mode) != want and st.st_uid == os.geteuid():
            os.fchmod(fd, want)
    finally:
        os.close(fd)


def open_nofollow(path: str, flags: int, mode: int = PRIVATE_FILE) -> int:
    """os.open of `path` with O_NOFOLLOW, its parent reached by the no-symlink chain; a symlink at
    `path` is an UnsafePath naming it."""
    directory, name = os.path.split(os.path.abspath(path))
    dfd = _walk(directory, PRIVATE_DIR, create=False)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):  # the last component is a symlink
            raise UnsafePath(
                f"{path} is a symlink: reconcile does not follow links where it writes; remove it "
                f"(rm {path}) and re-run"
            ) from None
        raise
    finally:
        os.close(dfd)


def open_append(path: str, mode: int = 0o640) -> int:
    """An O_APPEND fd of a log (made with `mode`), never through a symlink, never left writable by
    group or others, and only a regular file of root or us."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners():
            raise UnsafePath(f"{path} is not a regular file of root or ours: move it aside and re-run")
        if st.st_mode & 0o022:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run a block under `mask` (process-wide: only around single-threaded action code)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
