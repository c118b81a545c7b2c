"""Paths root writes or trusts: sshd's StrictModes check of their parents, a no-symlink mkdir/open
chain, private state (0700 dirs, 0600 files whatever the umask), and the umask for built trees.

Called by the path preflight rule (reconcile.preflight.paths), the state and report writers, and the
actions that open the server's log and build the venv and the model dir.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping

from reconcile.errors import ReconcileError
from reconcile.safety import elf
from reconcile.safety.display import shown
from reconcile.safety.untrusted import kind

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


O_PATH = getattr(os, "O_PATH", 0o10000000)  # Linux: a handle on a name, without read permission
_MAX_LINKS = 40  # what the kernel allows a path lookup (MAXSYMLINKS)


class Walked:
    """Where a walk ended: `dir_fd` (an O_PATH fd of the deepest existing directory, checked), its real
    path `dir_real`, the `name` of the last component in it and that entry's lstat (None when it is
    missing), and `missing`: the components below `name` that do not exist yet (empty when it exists
    or when only `name` is missing). The caller closes `dir_fd` (close())."""

    __slots__ = ("dir_fd", "dir_real", "missing", "name", "st")

    def __init__(self, dir_fd: int, dir_real: str, name: str, st: os.stat_result | None, missing: list[str]):
        self.dir_fd, self.dir_real, self.name, self.st, self.missing = dir_fd, dir_real, name, st, missing

    @property
    def real(self) -> str:
        return os.path.join(self.dir_real, self.name, *self.missing) if self.name else self.dir_real

    def close(self) -> None:
        os.close(self.dir_fd)


def _dir_problem(
    directory: str,
    st: os.stat_result,
    entry: tuple[str, os.stat_result] | None,
    ok: frozenset[int],
    *,
    own: bool,
) -> str | None:
    """sshd's StrictModes for one directory we pass: owned by root or us (`ok`), not group/other
    writable. Two exceptions, never for the path's `own` directory: a root directory that only a system
    group may write (Ubuntu's /var/log), and a sticky one (/tmp) when the `entry` (name, lstat) we take
    from it is ours: in a sticky directory only an entry's owner can rename or replace it."""
    if st.st_uid not in ok:
        return f"{directory} is owned by {_who(st.st_uid)}, who could replace what is in it"
    if not st.st_mode & 0o022 or (not own and _system_group_dir(st)):
        return None
    if st.st_mode & stat.S_ISVTX and not own:
        if entry is None or entry[1].st_uid in ok:
            return None
        return (
            f"{os.path.join(directory, entry[0])} is owned by {_who(entry[1].st_uid)}, who could replace it"
        )
    what = "world" if st.st_mode & 0o002 else f"group-{_group(st.st_gid)}"
    mode = stat.S_IMODE(st.st_mode)
    return f"{directory} is {what}-writable (mode {mode:04o}): others can plant or swap files"


def walk(
    path: str,
    allowed: Collection[int] | None = None,
    *,
    follow_last: bool = False,
    is_dir: bool = False,
    data: bool = False,
    made_later: bool = False,
) -> Walked:
    """The one path walk: from / one component at a time, each opened O_PATH|O_NOFOLLOW relative to
    the last, never by name from the top again. Every directory it passes is held to _dir_problem,
    symlinks' own directories included: a link is followed only from a directory that passed and is
    root's or ours (so only root or us can re-point it; not from one of an `allowed` other user's,
    such as the key owner's), and its target is walked the same way, `..` included. The last
    component is followed when it is a link only with `follow_last`. With `is_dir`, the path is a
    directory we make or use as such (ensure_dir): the directory holding it is not its "own"
    directory, so a sticky one (/tmp) may hold it when it is ours, or when we make it (a name someone
    else made first is then caught by the mkdir's O_NOFOLLOW open and owner check). Raises UnsafePath
    naming the first directory another user could change, or a component that is not a directory.
    With `data` (a tree from outside, copied as data: a `[model] source`), directories may be anyone's,
    but a link is still followed only from a directory of root or ours that nobody else may write: the
    tree's owner chooses what the tree holds, never which of root's directories root reads as theirs.
    With `made_later` (a path a tool or the server makes or reads later, long after this check, with
    no check of its own: a value, the environment, a path root reads), a missing path is judged by its
    deepest existing directory as its own directory: no sticky or system-group exception, since
    whoever makes the missing name first (anyone, in /tmp) owns what the tool then reads or writes."""
    ok = owners() if allowed is None else frozenset(allowed)
    # As the kernel resolves it: `..` from where a link led, never lexically (os.path.abspath would
    # make `<sticky>/L/../x` <sticky>/x, and pass by nobody's link L to their directory).
    full = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    todo = [c for c in full.split("/") if c][::-1]  # a stack: next component last
    stack: list[tuple[int, str, os.stat_result]] = []
    root = os.open("/", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    stack.append((root, "/", os.fstat(root)))
    links = 0
    try:
        while True:
            fd, where, dst = stack[-1]
            if not todo:  # the path was / (or walked back to it)
                return Walked(os.dup(fd), where, "", dst, [])
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            last = not todo
            try:
                nfd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                rest = [c for c in todo[::-1] if c not in ("", ".")]
                if ".." in rest:
                    raise UnsafePath(
                        f"{os.path.join(where, name)} does not exist, yet the path goes on through '..'"
                    ) from None
                # What we will create is ours; the directory is its own only when `name` is the last.
                # What a tool makes later, unchecked, is whoever's makes it first: always its own.
                own = made_later or (not rest and not is_dir)
                problem = None if data else _dir_problem(where, dst, None, ok, own=own)
                if problem is not None:
                    raise UnsafePath(problem) from None
                return Walked(os.dup(fd), where, name, None, rest)
            try:
                st = os.fstat(nfd)
                here = os.path.join(where, name)
                if stat.S_ISLNK(st.st_mode) and not (last and not follow_last):
                    # Followed only from a directory of root or us: another user `allowed` to own
                    # directories here (the key's owner) may not steer root's walk elsewhere.
                    problem = _dir_problem(where, dst, (name, st), ok & owners(), own=False)
                    if problem is not None:
                        raise UnsafePath(f"{problem} (the symlink {here} there is not followed)")
                    links += 1
                    if links > _MAX_LINKS:
                        raise UnsafePath(f"{path}: more than {_MAX_LINKS} symlinks on the way")
                    target = os.readlink(name, dir_fd=fd)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop()[0])
                    todo.extend(c for c in target.split("/")[::-1] if c)
                    continue
                if last or not stat.S_ISDIR(st.st_mode):
                    if not last:
                        raise UnsafePath(f"{here} is not a directory")
                    problem = None if data else _dir_problem(where, dst, (name, st), ok, own=not is_dir)
                    if problem is not None:
                        raise UnsafePath(problem)
                    return Walked(os.dup(fd), where, name, st, [])
                problem = None if data else _dir_problem(where, dst, (name, st), ok, own=False)
                if problem is not None:
                    raise UnsafePath(problem)
                stack.append((nfd, here, st))
                nfd = -1
            finally:
                if nfd >= 0:
                    os.close(nfd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def parent_problem(
    path: str,
    allowed: Collection[int] | None = None,
    *,
    follow: bool = False,
    is_dir: bool = False,
    made_later: bool = False,
) -> str | None:
    """Why another user could swap, plant or re-point `path` (None when nobody else can): walk()'s
    StrictModes rule on every directory on the way, links' own directories included, and an
    existing `path` owned by root or us (when it is a link: the link, and with `follow` its target
    walked the same way). `made_later`: as walk()'s (a missing path is not one reconcile makes)."""
    ok = owners() if allowed is None else frozenset(allowed)
    try:
        w = walk(path, ok, is_dir=is_dir, made_later=made_later)
        if follow and w.st is not None and stat.S_ISLNK(w.st.st_mode):
            if w.st.st_uid not in ok:
                w.close()
                return f"{w.real} is owned by {_who(w.st.st_uid)}, not by root or the user reconcile runs as"
            w.close()
            w = walk(path, ok, follow_last=True, made_later=made_later)
    except UnsafePath as exc:
        return str(exc)
    except OSError as exc:
        return f"{exc.filename or path}: cannot check it ({exc.strerror})"
    try:
        if w.st is not None and w.st.st_uid not in ok:
            return f"{w.real} is owned by {_who(w.st.st_uid)}, not by root or the user reconcile runs as"
        return None
    finally:
        w.close()


def data_root(path: str) -> str:
    """The real path of a data tree (the data role: a `[model] source`), reached by walk(data=True): its
    directories may be anyone's, but every link on the way was followed only from a directory only
    root or we can change. Callers read the tree by this path (with untrusted.source_roots of it), so a
    component its owner turns into a link later leads out of it, and is refused file by file. Raises
    UnsafePath naming the link; FileNotFoundError when absent."""
    w = walk(path, follow_last=True, data=True)
    try:
        if w.st is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return w.real
    finally:
        w.close()


def data_problem(path: str) -> str | None:
    """Why data_root(path) refuses `path` (None: it may be read as data, or is not there)."""
    try:
        data_root(path)
    except UnsafePath as exc:
        return str(exc)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{exc.filename or path}: cannot check it ({exc.strerror})"
    return None


_SAFE_TREES: list[set[tuple[str, frozenset[int], int]]] = []  # while walked_once() holds: trees found safe


@contextlib.contextmanager
def walked_once() -> Iterator[None]:
    """While it holds (one apply, under its lock), a tree read_problem found safe is not walked again:
    the plan before the Changes and the plan after them check a 6 GB site-packages once, not twice.
    Nobody but root or us can have changed what it found: every entry was root's or ours and not
    writable by group or others, and so was every directory above it. The way to the tree (its
    parents, its own owner and mode) is checked again each time; a tree with a problem is walked again."""
    _SAFE_TREES.append(set())
    try:
        yield
    finally:
        _SAFE_TREES.pop()


def read_problem(path: str, allowed: Collection[int] | None = None, *, entries: int = 0) -> str | None:
    """The read role (root reads `path` and trusts what it says): parent_problem(follow=True), and
    what the path leads to not writable by group or others either (a root-owned 0666 apt key or a
    0777 wheelhouse is anyone's to change). `entries`: for a directory whose files root reads in turn
    (1: its top level; -1: the whole tree, as for a wheelhouse pip installs from, whose pages may link
    below its top level, or a site-packages python imports from), each entry below it too: root's or
    ours, not writable by group or others, and a link judged as the path itself, a directory it leads
    to walked as its entries (_tree_problem)."""
    ok = owners() if allowed is None else frozenset(allowed)
    # A missing path is read later by whoever made it first: its directory must be root's or ours alone.
    problem = parent_problem(path, ok, follow=True, made_later=True)
    if problem is not None:
        return problem
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot check it ({exc.strerror})"
    if (loose := _loose(path, st)) is not None:
        return loose
    if entries == 0 or not stat.S_ISDIR(st.st_mode):
        return None
    real = os.path.realpath(path)
    seen = (real, ok, entries)
    if _SAFE_TREES and seen in _SAFE_TREES[-1]:
        return None  # walked whole in this apply and found safe (walked_once)
    problem = _tree_problem(real, ok, entries)
    if problem is None and _SAFE_TREES:
        _SAFE_TREES[-1].add(seen)
    return problem


def _tree_problem(real: str, ok: frozenset[int], entries: int) -> str | None:
    """read_problem's check of each entry below the directory `real` (`entries` levels; -1: all), in
    name order. Each directory is listed by a descriptor and its entries stat'ed relative to it
    (fstatat: no path looked up again per entry); a link is judged as a path itself, and a directory it
    leads to is walked as the link's own entries (python imports a package through a link: fourteenth
    round), each directory once (a link to an ancestor ends nothing)."""
    stack = [(real, 1)]
    listed: set[tuple[int, int]] = set()
    while stack:
        top, depth = stack.pop()
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # unreadable, or gone meanwhile: as walk_tree passes it over
        below: list[str] = []
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in listed:
                continue
            listed.add((st.st_dev, st.st_ino))
            with os.scandir(fd) as listing:
                found = sorted(listing, key=lambda e: e.name)
            for e in found:
                try:
                    est = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile: whoever removed it could write here, which was checked
                if stat.S_ISLNK(est.st_mode):
                    link = os.path.join(top, e.name)
                    if (problem := read_problem(link, ok)) is not None:
                        return problem
                    if (entries < 0 or depth < entries) and os.path.isdir(link):
                        below.append(os.path.realpath(link))
                    continue
                if est.st_uid not in ok:
                    entry = os.path.join(top, e.name)
                    return f"{entry} is owned by {_who(est.st_uid)}, who could change what root reads there"
                if est.st_mode & 0o022 and not _a_lock(e.name, est):
                    return _loose(os.path.join(top, e.name), est)
                if stat.S_ISDIR(est.st_mode) and (entries < 0 or depth < entries):
                    below.append(os.path.join(top, e.name))
        finally:
            os.close(fd)
        stack.extend((d, depth + 1) for d in reversed(below))
    return None


def _a_lock(name: str, st: os.stat_result) -> bool:
    """An empty lock file, which its tool only flocks and never reads: uv makes its cache's `.lock`
    0666 whatever the umask, so that users can share a cache (seen: uv 0.13.9, `<cache>/.lock`). What
    another user writes into it changes nothing a tool reads; a lock that is not empty is judged."""
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and (name == ".lock" or name.endswith(".lock"))


def search_path(value: str) -> tuple[str, list[str]]:
    """PATH as root may search it: each entry an absolute directory that only root or we can change
    (StrictModes on it and every directory above it, the read role), so that no program reconcile
    runs by name (git, apt-get, systemctl, uv, nvidia-smi) can be another user's. (the PATH kept,
    one "entry: why" per entry left out). A relative or empty entry (the current directory) is left
    out too."""
    kept, dropped = [], []
    for entry in value.split(os.pathsep):
        if not entry.startswith("/"):
            dropped.append(f"{entry or '(empty)'}: not an absolute directory")
            continue
        problem = read_problem(entry)
        if problem is None:
            kept.append(entry)
        else:
            dropped.append(f"{entry}: {problem}")
    return os.pathsep.join(kept), dropped


# Environment variables that name a directory (or file) the tools root runs take as their own: git's
# global config (which chooses programs: a filter, a pager), uv's and pip's config and caches (index
# URLs, built wheels, an interpreter's facts they trust next time), the hub's token and cache. Under
# `sudo -E` (or a sudo that keeps HOME) they are another user's.
ENV_DIRS = (
    "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
    "UV_CACHE_DIR", "PIP_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE",
)  # fmt: skip
# A directory a variable names is judged with what it holds, this many levels down (twelfth round): a
# tool reads its config there, `<dir>/<tool>/<file>` (pip's `<XDG_CONFIG_DIRS entry>/pip/pip.conf`,
# uv's, git's, fontconfig's). Not the whole tree, which for a cache or a tool's root (PYENV_ROOT: 130,000
# entries here) would be walked at every start; what lies deeper is left open (docs/security.md).
ENV_DEPTH = 3
ENV_FILES = ("PIP_CONFIG_FILE", "UV_CONFIG_FILE", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "APT_CONFIG")


def installer_config_files(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The config files pip and uv read for themselves where no variable names one (PIP_CONFIG_FILE and
    UV_CONFIG_FILE are the environment's rule's), as `environ` (after trusted_environment) places them,
    as (tool, path): pip's site-wide files (each XDG_CONFIG_DIRS entry's pip/pip.conf, /etc/pip.conf)
    and per-user ones (~/.pip/pip.conf, XDG_CONFIG_HOME's pip/pip.conf); uv's (XDG_CONFIG_DIRS'
    uv/uv.toml, /etc/uv/uv.toml, XDG_CONFIG_HOME's uv/uv.toml) and the project files it finds from its
    working directory up, "/" (uv.toml, pyproject.toml's [tool.uv]). Each chooses the index, find-links
    or constraints root installs from. And setuptools' (~/.pydistutils.cfg), which it reads whenever pip
    or uv has it build an sdist: its options choose where the build is made and what it compiles with
    (eighteenth round: `[build] build_base` in nobody's directory packed nobody's module into root's
    wheel). (The venv's own pip.conf is the venv's walk's.)"""
    home = environ.get("HOME") or "/"
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    config_dirs = [d for d in (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    pip = [*(os.path.join(d, "pip", "pip.conf") for d in config_dirs), "/etc/pip.conf"]
    pip += [os.path.join(home, ".pip", "pip.conf"), os.path.join(config_home, "pip", "pip.conf")]
    uv = [*(os.path.join(d, "uv", "uv.toml") for d in config_dirs), "/etc/uv/uv.toml"]
    uv += [os.path.join(config_home, "uv", "uv.toml"), "/uv.toml", "/pyproject.toml"]
    found = [
        *(("pip", p) for p in pip),
        *(("uv", p) for p in uv),
        ("setuptools", os.path.join(home, ".pydistutils.cfg")),
    ]
    return [(tool, p) for tool, p in dict.fromkeys(found) if p.startswith("/")]


def installer_cache_dirs(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The caches pip and uv keep, as (tool, path), as `environ` places them (PIP_CACHE_DIR, UV_CACHE_DIR,
    else XDG_CACHE_HOME's or ~/.cache's pip and uv): uv installs a wheel it unpacked there before from
    what that directory holds, never reading the wheel again; pip takes index pages and downloads from
    it."""
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or "/", ".cache")
    pip = environ.get("PIP_CACHE_DIR") or os.path.join(cache_home, "pip")
    uv = environ.get("UV_CACHE_DIR") or os.path.join(cache_home, "uv")
    return [(tool, p) for tool, p in (("pip", pip), ("uv", uv)) if p.startswith("/")]


def pyvenv_cfg(bindir: str) -> str | None:
    """The pyvenv.cfg getpath reads for a python in `bindir`: beside it, else one up; None when neither."""
    found = [c for c in (bindir, os.path.dirname(bindir)) if os.path.isfile(os.path.join(c, "pyvenv.cfg"))]
    return os.path.join(found[0], "pyvenv.cfg") if found else None


def pyvenv_home(cfg: str) -> str | None:
    """The `home` a pyvenv.cfg at `cfg` names (the directory of the python whose install a venv's python
    takes its library from), as getpath reads it: the first line whose key is `home` in any case, its
    value as written (getpath walks up from it by name, links unresolved), from "/" (the working
    directory of everything root runs) when relative (nineteenth round: `HOME =`, and a `home` whose
    `bin` is a link, each moved python to a library that was not judged), a byte that is not UTF-8 kept
    as that byte, the file ending at a NUL (twentieth: read as U+FFFD, the byte named a path that is not
    there; a `home` after a NUL was read where getpath read none); None when there is none or it cannot
    be read."""
    for line in getpath_lines(cfg) or []:
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "home":
            return os.path.join("/", value.strip())
    return None


def getpath_lines(path: str) -> list[str] | None:
    """The lines of a file python's getpath reads (pyvenv.cfg, a `._pth`), as it reads them: a C string
    (it ends at a NUL), split at each `\\n` only, a byte that is not UTF-8 kept as that byte (each path
    names it); None when it cannot be read."""
    from reconcile.safety.untrusted import read_regular

    try:
        data = read_regular(path, 1 << 16).split(b"\0")[0]
    except OSError:
        return None
    return data.decode("utf-8", "surrogateescape").split("\n")


def tool_dir_problem(path: str, allowed: Collection[int] | None = None) -> str | None:
    """A directory a tool keeps its config or cache in (ENV_DIRS' values, the installers' caches): the
    write-dir role (env_dir_problem), and what it holds, ENV_DEPTH levels of it, the read role."""
    return env_dir_problem(path, allowed) or read_problem(path, allowed, entries=ENV_DEPTH)


# Not a list of names: every variable whose value names a path (an absolute path, a file:// URL, a
# relative word that exists, or a list of them) is held to the same rule, a directory to the write-dir
# role and a file to the read role. The sixth and seventh rounds held the tools' namespaces (UV_, PIP_,
# GIT_, HF_, XDG_, PYTHON, APT_, DPKG_, ...), and the eighth found a library's outside them: every
# process that loads libcrypto (Python's hashlib and ssl: reconcile itself, pip, the venv's python)
# reads the file $OPENSSL_CONF names, which loads providers (shared objects) as it starts; glibc's
# GCONV_PATH and LOCPATH, a venv's VIRTUAL_ENV, pip's private _PIP_STANDALONE_CERT are alike. sudo -E
# keeps all of those (its env_delete strips LD_*, PYTHONPATH, PYTHONHOME and a few shells' variables).
# What is left unchecked is what only describes the invocation, which nothing reconcile runs reads as a
# place to load from (PATH has its own rule: search_path).
ENV_INERT = (
    "PATH", "PWD", "OLDPWD", "_", "SHLVL", "USER", "LOGNAME", "MAIL",
    "SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND",
)  # fmt: skip


# A value names paths in more forms than a bare absolute one: `--download-dir=/x`, `a=/x,b=/y`, JSON
# (`{"cache_dir": "/x"}`), a file URL (`file:///x`, `file://localhost/x`, `file:/x`), a relative path
# (every tool reconcile runs, and the server, runs in "/": `tmp/x` is /tmp/x) and `~` (expanded by the
# tool, to a home nobody checked). Other URLs name no local path; a word that names nothing under "/"
# (a hub id `org/model`, a number, a flag) is not a path.
_FILE_URL = re.compile(r"file:(?://[^/\s\"',;]*)?(?=/)", re.IGNORECASE)  # FILE:/// too (RFC 3986 3.1)
_OTHER_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"',;]*")
_WORD_SPLIT = re.compile(r"[\s:=,;\"'{}\[\]()]+")
# A tool reads a path whole, blanks, `=` and `,` and all (python's PYTHONPATH splits at `:` only): each
# piece between the separators other than blanks, and each between `:` alone, is a word too, so `/a -b`
# and `/a=-b` are judged as themselves, not only as `/a` and the flag `-b` (fifteenth round).
_PIECE_SPLITS = (re.compile(r"[:=,;\"'{}\[\]()]+"), re.compile(r":+"))


def _env_paths(value: str, bases: Collection[str] = ("/",)) -> list[str]:
    """The paths a value names (see _WORD_SPLIT): each absolute word; each relative one, resolved
    against each of `bases` (the directories it may be read from), where its first component exists
    there or it climbs with `..`; and a word starting with '~' as itself (refused: not absolute). In
    the value as written and as the tools decode it (_decoded_forms): a path is a path in whichever
    form a tool reads it."""
    paths: list[str] = []
    for form in _decoded_forms(value):
        text = _OTHER_URL.sub(" ", _FILE_URL.sub(" ", form))
        # And the form itself, as written: a program that reads the value as one path (python's
        # PYTHONPYCACHEPREFIX, a hub's HF_HOME) reads `/a:b`, `/afile:/b` and `/a_b://c` whole, which
        # the splits and the URLs blanked out never judge (seventeenth round).
        words = [form, *(w for split in (_WORD_SPLIT, *_PIECE_SPLITS) for w in split.split(text))]
        for w in dict.fromkeys(words):
            if w.startswith(("/", "~")):
                paths.append(w)
            elif w and not w.startswith("-"):
                # A word with `..` in it is a path whatever its first component: a tool makes what is
                # missing (os.makedirs) or normalises it away (`new/../var/x` is var/x) (twelfth round).
                first = w.split("/", 1)[0]
                climbs = ".." in w.split("/")
                paths += [
                    os.path.join(b, w) for b in bases if climbs or os.path.lexists(os.path.join(b, first))
                ]
    return list(dict.fromkeys(paths))


_JSON_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|[\\/\"bfnrt])")
_JSON_CHARS = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _decoded_forms(value: str) -> list[str]:
    """`value`, and what a tool reading it decodes it to: a file URL's percent-escapes (pip and uv
    unquote `file:///%76ar/x` to /var/x), a JSON string's escapes (vLLM's json.loads of a JSON flag
    reads `"\\/var\\/x"` and `"\\u002fvar/x"` as /var/x), and both."""
    from urllib.parse import unquote

    def unescape(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            e = m.group(1)
            return chr(int(e[1:], 16)) if e[0] == "u" else _JSON_CHARS.get(e, e)

        return _JSON_ESCAPE.sub(one, text)

    forms = [value]
    if "\\" in value:
        forms.append(unescape(value))
    forms += [unquote(f) for f in list(forms) if "%" in f]
    return list(dict.fromkeys(forms))


def _env_path_problem(path: str, allowed: Collection[int] | None = None, *, depth: int = 0) -> str | None:
    """An existing file: the read role; a directory, or what is missing (made by the tool): write-dir,
    and what the directory holds, `depth` levels of it (-1: all), to the read role."""
    if path.startswith("~"):
        return f"{path}: not an absolute path (the tool expands ~ to a home reconcile does not check)"
    for form in _resolutions(path):
        try:
            is_file = not stat.S_ISDIR(os.stat(form).st_mode)
        except OSError:
            is_file = False
        if is_file:
            problem = read_problem(form, allowed)
        else:
            problem = env_dir_problem(form, allowed) or (
                read_problem(form, allowed, entries=depth) if depth else None
            )
        if problem is not None:
            return problem
    return None


def _resolutions(path: str) -> list[str]:
    """The ways a tool may resolve `path`: as the kernel does (walk() takes `..` from where a link led:
    `<sticky>/L/../x` is x beside L's target) and as a tool that normalises it first does (Python's
    abspath, site.py's .pth lines: `<sticky>/x`)."""
    return list(dict.fromkeys((path, os.path.normpath(path))))


def env_value_problem(
    value: str, allowed: Collection[int] | None = None, bases: Collection[str] = ("/",), *, depth: int = 0
) -> str | None:
    """Why a value handed to a program (an environment variable, a flag) names a path another user
    could change (None when none does): each path in it (_env_paths, a relative one resolved against
    each of `bases`) by _env_path_problem, a directory with `depth` levels of what it holds (-1: the
    whole tree, for the server's values: it imports, loads and runs what a directory it is handed
    holds, PYTHONPATH's modules, a library path's objects, a cache's compiled artifacts)."""
    paths = _env_paths(value, bases)
    return next((p for p in (_env_path_problem(w, allowed, depth=depth) for w in paths) if p), None)


def index_problem(value: str, allowed: Collection[int] | None = None) -> str | None:
    """Why a package index pip or uv installs from (`[venv] index_url`, `extra_index_urls`) is not root's
    or ours alone: each local path it names (a `file://` URL, percent-escapes decoded, or a path; a
    remote URL names none) held to the read role, its whole tree, as a wheelhouse's wheels are: the
    wheels and sdists there are what root installs and builds. (A URL: listener_problem.)"""
    paths = [p for p in _env_paths(value) if not p.startswith("~")]
    problems = (read_problem(f, allowed, entries=-1) for w in paths for f in _resolutions(w))
    return next((p for p in problems if p), None)


def listener_problem(value: str, allowed: Collection[int] | None = None) -> str | None:
    """Why a network location in `value` on this machine (a URL, or a proxy's host:port, in the value as
    written and as a tool decodes it: reconcile.safety.locations) could answer in root's place: a
    listener on its port of another user's (it serves the wheels, model files or answers root takes, or
    reads what root sends a proxy: a token, an index's password), or none on a port any user may bind
    after this check. A remote host is the network's to trust, not judged here."""
    from reconcile.safety.locations import listeners, local_locations, only_root_binds

    ok = owners() if allowed is None else frozenset(allowed)
    table: dict[int, list[int]] | None = None  # read once, for however many locations
    for host, port in dict.fromkeys(loc for form in _decoded_forms(value) for loc in local_locations(form)):
        if port is None:
            return f"{host} is this machine, and which port the URL names is not known: write the port"
        table = listeners() if table is None else table
        uids = table.get(port, [])
        if not uids and not only_root_binds(port):
            return f"nothing listens on port {port} on {host}: anyone may bind it before root connects"
        if (other := next((u for u in uids if u not in ok), None)) is not None:
            return (
                f"port {port} on {host} is listened on by {_who(other)}, not by root or the user reconcile "
                "runs as: it would answer in root's place"
            )
    return None


def env_dir_problem(path: str, allowed: Collection[int] | None = None) -> str | None:
    """Why a directory a tool keeps its config or cache in is not root's or ours alone: the write-dir
    role (StrictModes on the way, links only from directories of root or ours, the directory itself
    root's or ours and writable by nobody else). A missing one is made by the tool later, unchecked:
    the deepest directory that exists must be root's or ours alone (not /tmp: whoever makes the name
    there first would own it)."""
    if not path.startswith("/"):
        return f"{path or '(empty)'}: not an absolute path"
    problem = parent_problem(path, allowed, follow=True, is_dir=True, made_later=True)
    if problem is not None:
        return problem
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot check it ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is {kind(st.st_mode)}, not a directory"
    return _loose(path, st)


def trusted_environment(environ: Mapping[str, str]) -> tuple[dict[str, str | None], list[str]]:
    """What to change in `environ` so that no tool root runs (nor a library reconcile loads) takes its
    config, cache or code from a place another user can change (ENV_DIRS: the write-dir role;
    ENV_FILES: the read role; every other variable but ENV_INERT: each path its value names, and each
    network location on this machine, listener_problem): each
    such variable is left out, HOME replaced by the home of the user reconcile runs as. Returns (name ->
    new value, None to unset) and one "NAME left out: path: why" line for each."""
    changes: dict[str, str | None] = {}
    notes: list[str] = []
    named = [n for n in sorted(environ) if n not in (*ENV_DIRS, *ENV_FILES, *ENV_INERT)]
    for name in (*ENV_DIRS, *ENV_FILES, *named):
        value = environ.get(name)
        if not value:
            continue
        if name in ENV_DIRS:  # HOME left out is our own: the tools' defaults anyway
            problem = env_dir_problem(value) if name == "HOME" else tool_dir_problem(value)
        elif name in ENV_FILES:
            problem = read_problem(value)
            if problem is None and not value.startswith("/"):
                problem = f"{value}: not an absolute path"
        else:  # a relative path: from "/" (the tools' cwd) and from ours (what reconcile reads itself)
            problem = env_value_problem(value, bases=("/", os.getcwd()), depth=ENV_DEPTH) or listener_problem(
                value
            )
        if problem is None:
            continue
        why = f"{name} left out: {value}: {problem}"
        if name == "HOME":
            import pwd

            home = pwd.getpwuid(os.geteuid()).pw_dir
            ok = home != value and env_dir_problem(home) is None
            changes[name] = home if ok else "/"
            why += f"; HOME={changes[name]}"
        else:
            changes[name] = None
        notes.append(why)
    return changes, notes


def _loose(path: str, st: os.stat_result) -> str | None:
    if not st.st_mode & 0o022:
        return None
    who = "others" if st.st_mode & 0o002 else f"group {_group(st.st_gid)}"
    mode = stat.S_IMODE(st.st_mode)
    return f"{path} is writable by {who} (mode {mode:04o}): they could change what root reads"


def check_parents(
    path: str, what: str, allowed: Collection[int] | None = None, *, is_dir: bool = False
) -> None:
    """Raise UnsafePath (naming `what`, the directory and the fix) when parent_problem() finds one."""
    problem = parent_problem(path, allowed, is_dir=is_dir)
    if problem is not None:
        raise UnsafePath(f"{what} {path}: {problem}; {FIX}")


FIX = "move it under a directory only root can write (/var/lib, /srv, /opt) or fix that directory's mode"
LISTENER_FIX = (
    "name a port that root's (or your) own service listens on, or one below 1024, or a remote host; "
    "or stop that listener"
)


def _walk(path: str, mode: int, *, create: bool) -> int:
    """An O_RDONLY fd of directory `path`, reached by walk() (every directory checked, no link
    followed from a directory others may write); missing components are made with `mode` (then
    fchmod: no umask), each opened O_NOFOLLOW right after its mkdir and checked to be ours."""
    w = walk(path, follow_last=True, is_dir=True)
    try:
        names = [w.name, *w.missing] if w.st is None else []
        if w.st is not None and not stat.S_ISDIR(w.st.st_mode):
            raise UnsafePath(f"{w.real} is not a directory: move it aside or choose another path")
        if names and not create:
            raise FileNotFoundError(
                errno.ENOENT, "No such file or directory", os.path.join(w.dir_real, w.name)
            )
        start = os.path.join(w.dir_real, w.name) if w.st is not None else w.dir_real
        fd = os.open(
            w.name if w.st is not None and w.name else ".",
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
            dir_fd=w.dir_fd,
        )
    finally:
        w.close()
    where = start
    try:
        for name in names:
            made = False
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


def write_new_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int,
    uid: int,
    gid: int,
    prefix: str,
    checkpoint: Callable[[str], None] | None = None,
) -> None:
    """Write file `name` in the directory open at `dir_fd` (reached by walk(), never by its name
    again), atomically: a temp file (`prefix`: host.temp_prefix, so the stale-temp sweep knows it)
    made O_EXCL|O_NOFOLLOW there, mode and owner set before a byte is written, fsync, renamed over
    `name` within the same directory descriptor, the directory fsynced. `checkpoint` (host.checkpoint)
    names the points where the crash-safety tests kill the writer, as host.atomic_write's."""
    import secrets

    tmp = f"{prefix}{secrets.token_hex(4)}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        try:
            os.fchmod(fd, mode)
            os.fchown(fd, uid, gid)
            half = len(data) // 2
            for i, part in enumerate((data[:half], data[half:])):
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
                if i == 0 and checkpoint is not None:
                    checkpoint(f"atomic_write.partial:{name}")
            os.fsync(fd)
        finally:
            os.close(fd)
        if checkpoint is not None:
            checkpoint(f"atomic_write.rename:{name}")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Remove directory `name` in the directory open at `dir_fd` and all below it, by descriptor and
    without recursion (shutil.rmtree recurses once a level in Python 3.11: a tree nested 1,100 deep
    is a RecursionError, half removed). One directory descriptor is held at a time (a deep tree
    would exhaust the fd limit otherwise): down through each subdirectory opened O_NOFOLLOW, a link
    removed as a link, never followed; back up through `..` of a directory we opened, once empty."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    names = [name]
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        while True:
            child = None
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            for entry, is_dir in entries:
                if is_dir:
                    child = entry
                    break
                os.unlink(entry, dir_fd=fd)
            if child is not None:
                fd, up = os.open(child, flags, dir_fd=fd), fd
                os.close(up)
                names.append(child)
                continue
            done = names.pop()
            if not names:
                os.close(fd)
                fd = -1
                os.rmdir(done, dir_fd=dir_fd)
                return
            fd, up = os.open("..", flags & ~os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(up)
            os.rmdir(done, dir_fd=fd)
    finally:
        if fd >= 0:
            os.close(fd)


def open_dir(path: str) -> int:
    """An O_RDONLY descriptor of the existing directory `path`, reached by walk() (every directory on
    the way checked, a link followed only from a directory only root or we can write). The caller
    lists, renames and removes through it (dir_fd), never by the name again."""
    return _walk(path, PRIVATE_DIR, create=False)


def ensure_dir(path: str, mode: int = PRIVATE_DIR) -> None:
    """Make directory `path` (and what is missing above it, with `mode`) through walk(): nothing is
    made where another user could swap a component. `path` itself ends with exactly `mode` when it is
    PRIVATE_DIR (state must stay private whatever made it first). An existing directory that others
    may write is an UnsafePath, never chmodded: it may be shared (/tmp), and it is not ours to fix."""
    check_parents(path, "directory", is_dir=True)
    fd = _walk(path, mode, create=True)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o022 and stat.S_IMODE(st.st_mode) & ~mode & 0o022:
            what = "world" if st.st_mode & 0o002 else f"group-{_group(st.st_gid)}"
            raise UnsafePath(
                f"directory {path}: {path} is {what}-writable (mode {stat.S_IMODE(st.st_mode):04o}): others "
                f"can plant or swap files in it; {FIX}"
            )
        if mode == PRIVATE_DIR and stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():
            os.fchmod(fd, mode)  # an older reconcile made state 0755: tighten it
    finally:
        os.close(fd)


def open_nofollow(path: str, flags: int, mode: int = PRIVATE_FILE) -> int:
    """os.open of `path` with O_NOFOLLOW, relative to its directory's fd from walk() (so every
    directory on the way was checked); a symlink at `path` is an UnsafePath naming it."""
    directory, name = os.path.split(os.path.abspath(path))
    dfd = _walk(directory, PRIVATE_DIR, create=False)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise UnsafePath(
                f"{path} is a symlink: reconcile does not follow links where it writes; remove it "
                f"(rm {path}) and re-run"
            ) from None
        raise
    finally:
        os.close(dfd)


def open_regular(
    path: str, *, max_bytes: int, allowed: Collection[int] | None = None, follow: bool = True
) -> bytes:
    """The bytes of a file root reads from a path the spec names (a key source, a secret file): reached
    by walk() (a link only from a directory only root or us can write, when `follow`), opened
    O_NONBLOCK (a FIFO never blocks us), fstat'ed on the fd: a regular file of root or `allowed`, at
    most `max_bytes`. Anything else is an UnsafePath naming it; FileNotFoundError when absent."""
    ok = owners() if allowed is None else frozenset(allowed)
    w = walk(path, ok, follow_last=follow)
    try:
        if w.st is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        fd = os.open(w.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=w.dir_fd)
    finally:
        w.close()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(
                f"{path} is {kind(st.st_mode)}, not a regular file: reconcile reads only regular files"
            )
        if st.st_uid not in ok:
            raise UnsafePath(
                f"{path} is owned by {_who(st.st_uid)}, not by root or the user reconcile runs as"
            )
        if st.st_size > max_bytes:
            raise UnsafePath(f"{path} is {st.st_size} bytes, more than the {max_bytes} reconcile reads there")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise UnsafePath(f"{path} grew past {max_bytes} bytes while read")
        return data
    finally:
        os.close(fd)


def resolve_exec(
    path: str, allowed: Collection[int] | None = None, *, what: str = "program", search: str | None = None
) -> str:
    """The real path of a program root will run, after walk() (links followed only from directories
    only root or us can write): a regular, executable file of root or us that nobody else may write,
    and, for a `#!` script, its interpreter held to the same rule. Raises UnsafePath naming the
    problem. Why the caller then execs this name and not the fd (fexecve): a script run from
    /proc/self/fd/N hands its interpreter that name, and vLLM's spawned workers re-import their main
    module from it after the fd is gone; and systemd execs by name. Every directory on this real path
    is one only root or us can change, so the name cannot be re-pointed by anyone else. `search`: the
    PATH the program runs with (a `#!/usr/bin/env NAME` script's NAME is found there; default ours)."""
    ok = owners() if allowed is None else frozenset(allowed)
    return _resolve_exec(path, ok, what, 0, os.environ.get("PATH", os.defpath) if search is None else search)


def _resolve_exec(path: str, ok: frozenset[int], what: str, depth: int, search: str) -> str:
    try:
        w = walk(path, ok, follow_last=True)
    except UnsafePath as exc:
        if depth == 0:
            raise
        raise UnsafePath(f"{what}: {exc}") from None
    try:
        if w.st is None:
            raise UnsafePath(f"{what} {path} does not exist")
        real = w.real
        fd = os.open(w.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=w.dir_fd)
    except OSError as exc:
        raise UnsafePath(f"{what} {path}: cannot open it ({exc.strerror})") from None
    finally:
        w.close()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{what} {path} is {kind(st.st_mode)}, not a regular file")
        if st.st_uid not in ok:
            raise UnsafePath(f"{what} {path} is owned by {_who(st.st_uid)}, who could change what root runs")
        if st.st_mode & 0o022:
            who = "world" if st.st_mode & 0o002 else f"group-{_group(st.st_gid)}"
            raise UnsafePath(f"{what} {path} is {who}-writable (mode {stat.S_IMODE(st.st_mode):04o})")
        if not st.st_mode & 0o111:
            raise UnsafePath(f"{what} {path} is not executable (mode {stat.S_IMODE(st.st_mode):04o})")
        head = os.read(fd, _BINPRM_BUF)
        loads = elf.loads(fd)
    finally:
        os.close(fd)
    if (problem := _loader_problem(real, loads, ok, set(), _library_path(real))) is not None:
        raise UnsafePath(f"{what} {path}: {problem}")
    if head.startswith(b"#!"):
        if depth >= SHEBANG_DEPTH:
            raise UnsafePath(
                f"{what} {path}: more than {SHEBANG_DEPTH} `#!` interpreters deep: cannot check what it runs"
            )
        interp, rest = _shebang_line(head)
        if interp:
            # Bytes as the kernel hands them (fifteenth round): a byte that is not UTF-8 is judged as
            # itself, never as U+FFFD, and os's calls open that very name.
            name = os.fsdecode(interp)
            if not name.startswith("/"):  # the kernel looks it up from the runner's cwd ("/" for the server)
                raise UnsafePath(
                    f"{what} {path}: its `#!` interpreter {shown(name, 80)} is a relative path, which the "
                    "kernel resolves from the working directory of whoever runs it: name it by its "
                    "absolute path"
                )
            real_interp = _resolve_exec(name, ok, f"interpreter {name} of {what} {path}", depth + 1, search)
            arg = os.fsdecode(rest)
            # The interpreter gets the argument whole (python: `-Xpycache_prefix=/a -b` is the directory
            # `/a -b`); env -S, perl and others split it again: judged whole and word by word.
            _shebang_values(
                list(dict.fromkeys([arg, *_shebang_words(arg)])), ok, name, what, path, depth, search
            )
            # `#!/usr/bin/env NAME`: the interpreter is env, root's; the program is NAME, which env finds
            # on the PATH the script runs with (`search`: a server's is the launcher's, its venv's bin
            # first, then [server] env PATH's directories where the spec sets it, then ours). env is
            # known by the name on the line or the one its links lead to.
            if "env" in (os.path.basename(name), os.path.basename(real_interp)):
                program, args = _env_program(arg, name, what, path, search)
                if program is not None:
                    runs = f"program {program} that {name} runs for {what} {path}"
                    _only_options(args, program, what, path)
                    _resolve_exec(program, ok, runs, depth + 1, search)
            else:
                _only_options(_shebang_words(arg), name, what, path)
    return real


# Where glibc's loader looks inside each directory a program's RPATH or RUNPATH names, before the
# directory itself (`ld.so --help`: glibc-hwcaps/x86-64-v3/, and the legacy tls/, haswell/, avx512_1/,
# x86_64/ and their nestings, as AT_PLATFORM and the CPU's capabilities name them).
_HWCAP_DIRS = ("glibc-hwcaps", "tls", "haswell", "xeon_phi", "avx512_1", "x86_64", "i686", "i586", "aarch64")
_LOADS_MAX = 64  # libraries read in turn; more is refused, not skipped (the loader's own limit is memory)


_DST = re.compile(r"\$(?:\{(ORIGIN|LIB|PLATFORM)\}|(ORIGIN|LIB|PLATFORM)(?![A-Za-z0-9_]))")  # ld.so's


def _search_dirs(entries: list[str], origin: str) -> list[str]:
    """A program's RPATH/RUNPATH entries as the loader reads them (_expand); an empty or relative entry
    is from the working directory ("/" for everything root runs)."""
    found = [
        os.path.normpath(os.path.join("/", form)) for entry in entries for form in _expand(entry, origin)
    ]
    return list(dict.fromkeys(found))


def _expand(text: str, origin: str) -> list[str]:
    """What the loader may make of `text` (an RPATH/RUNPATH entry, or a library's name with a `/`:
    twentieth round, a DT_NEEDED `$ORIGIN/theirs/libz9.so` was judged as the path `/$ORIGIN/...`, which
    is not there): $ORIGIN (${ORIGIN}) is the directory of the object's real path; $LIB and $PLATFORM
    each of what glibc may make of them."""
    import sysconfig

    m = _DST.search(text)
    if m is None:
        return [text]
    machine = os.uname().machine
    tokens = {
        "ORIGIN": [origin],
        "LIB": ["lib", "lib64", f"lib/{sysconfig.get_config_var('MULTIARCH') or machine + '-linux-gnu'}"],
        "PLATFORM": [machine, "haswell", "xeon_phi"],
    }
    values = tokens[m.group(1) or m.group(2)]
    return [text[: m.start()] + v + rest for v in values for rest in _expand(text[m.end() :], origin)]


def _library_path(program: str) -> list[str]:
    """The directories LD_LIBRARY_PATH names in our environment, which what root runs inherits: the
    loader searches them for the libraries of the program and of each library (twentieth round: a
    library of root's found there, its RUNPATH nobody's directory, loaded nobody's library as uid 0).
    The directories themselves are held to the environment rule (env_dir_problem)."""
    value = os.environ.get("LD_LIBRARY_PATH")
    return [] if value is None else _search_dirs(re.split("[:;]", value), os.path.dirname(program))


def _library_copies(directory: str, name: str) -> list[str]:
    """Where the loader may find the library `name` in a search directory: in the hardware-capability
    subdirectories it tries first (glibc-hwcaps/x86-64-v3/, haswell/x86_64/: nineteenth round, a copy
    there whose own RUNPATH was nobody's directory loaded unread), then in the directory itself."""
    found = []
    for top in (os.path.join(directory, d) for d in _HWCAP_DIRS):
        for root, subdirs, files in os.walk(top, followlinks=True):
            found += [os.path.join(root, name)] if name in files else []
            if root.count("/") - top.count("/") >= 4:  # the loader's nestings are shallower
                subdirs.clear()
    return [*found, os.path.join(directory, name)]


def _loader_problem(
    path: str, loads: elf.Loads, ok: frozenset[int], seen: set[tuple[str, frozenset[str]]], above: list[str]
) -> str | None:
    """What the kernel and the dynamic loader read for the ELF program at `path` (a program's real path,
    /proc/self/exe; a library's name as the loader found it: each is its $ORIGIN) before its first
    instruction, held to the read role (eighteenth round: a shared python's libpython3.X.so.1.0 of
    nobody's, found through its RUNPATH `$ORIGIN/../lib`, ran as root): its program interpreter, a
    library it names by path, each directory its RPATH or RUNPATH names (its top level, and the
    hardware-capability subdirectories the loader tries first, whole), and, in turn, what each library
    found there loads; an ELF file whose headers do not read as one answer (elf.Loads.unreadable) is
    refused. The system's directories (/etc/ld.so.cache, /lib, /usr/lib) are root's. `above`: the
    DT_RPATH directories of the objects it is loaded under (and LD_LIBRARY_PATH's: _library_path), which
    the loader searches for its libraries too (twentieth round: a program's DT_RPATH found a library of
    a library that named no directory, and that library's RUNPATH was nobody's); an object is read once
    for each set of them."""
    seen.add((os.path.realpath(path), frozenset(above)))
    if loads.unreadable is not None:
        why, fix = loads.unreadable, "use a build whose ELF headers are as a linker writes them"
        return f"reconcile cannot read what the kernel and the dynamic loader load for {path} ({why}): {fix}"
    origin = os.path.dirname(path)
    dirs = _search_dirs(loads.search, origin)
    below = list(dict.fromkeys([*_search_dirs(loads.rpath, origin), *above]))
    named = [os.path.join("/", p) for n in loads.needed if "/" in n for p in _expand(n, origin)]
    for opened in filter(None, [loads.interpreter, *named]):
        if (problem := read_problem(os.path.join("/", opened), ok)) is not None:
            return f"the dynamic loader reads {opened} for it: {problem}"
    for directory in dirs:
        tried = [(directory, 1), *((os.path.join(directory, d), -1) for d in _HWCAP_DIRS)]
        problem = next(filter(None, (read_problem(p, ok, entries=n) for p, n in tried)), None)
        if problem is not None:
            return f"the dynamic loader looks for its libraries in {directory} (its RPATH/RUNPATH): {problem}"
    libraries = list(named)
    searched = dict.fromkeys([*dirs, *above])  # `above`'s directories were judged where they were named
    libraries += [p for d in searched for n in loads.needed if "/" not in n for p in _library_copies(d, n)]
    for library in libraries:
        if (os.path.realpath(library), frozenset(below)) in seen or not os.path.isfile(library):
            continue
        if len(seen) >= _LOADS_MAX:  # nineteenth round: the 9th of 8 was skipped unread, and loaded
            return f"it loads more than {_LOADS_MAX} libraries from its RPATH/RUNPATH: too many to read"
        inner = _elf_loads(library)
        if inner is not None and (problem := _loader_problem(library, inner, ok, seen, below)) is not None:
            return problem
    return None


def _elf_loads(path: str) -> elf.Loads | None:
    """What the ELF file at `path` has the loader load; None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return elf.loads(fd)
    finally:
        os.close(fd)


def dlopen_problem(path: str, allowed: Collection[int] | None = None) -> str | None:
    """What the loader loads for a shared object of root's or ours that a program dlopens as it runs (a
    python extension module, `lib-dynload/*.so`: twentieth round, one whose RUNPATH was nobody's
    directory loaded nobody's library as uid 0 at `-m venv`), held as the exec role holds a program's
    libraries (_loader_problem); None for a file that is not ELF."""
    loads = _elf_loads(path)
    ok = owners() if allowed is None else frozenset(allowed)
    return None if loads is None else _loader_problem(path, loads, ok, set(), _library_path(path))


_BINPRM_BUF = 256  # how much of a script the kernel reads for its `#!` line (BINPRM_BUF_SIZE)


def _shebang_line(head: bytes) -> tuple[bytes, bytes]:
    """The interpreter and the one argument the kernel reads from a `#!` line (binfmt_script.c), from
    the first 256 bytes of the script (`head`): the line ends at a newline in them, else at offset 254
    (the buffer's last byte is never part of it: seventeenth round), blanks around it dropped; the
    interpreter ends at the first space, tab or NUL; the argument is the rest after spaces and tabs, up
    to a NUL (a C string), handed whole."""
    end = head.find(b"\n")
    line = head[2 : end if end >= 0 else _BINPRM_BUF - 1].strip(b" \t")
    interp = re.split(rb"[ \t\0]", line, maxsplit=1)[0]
    rest = line[len(interp) :]
    if rest.startswith(b"\0"):
        return interp, b""
    return interp, rest.lstrip(b" \t").split(b"\0", 1)[0]


def _shebang_words(arg: str) -> list[str]:
    """The words of a `#!` line's argument, split where env -S splits: at a space or a tab only (the
    kernel does not split it: the interpreter gets it whole, judged whole as well). str.split also
    splits at \\v, \\f, \\x1c-\\x1f, U+00A0 and the other Unicode blanks, which no interpreter does:
    `-Xpycache_prefix=/a<\\x1f>-b` was judged as `/a` and `-b`, while python read the directory
    `/a<\\x1f>-b` (fifteenth round)."""
    return [word for word in re.split(r"[ \t]+", arg) if word]


def _only_options(args: list[str], runner: str, what: str, path: str) -> None:
    """The words a `#!` line hands its interpreter (or env -S its program) besides the script: options
    only. A word that is not one may be a program it runs by name (nice, nohup, setsid, env by another
    name, a shell's script found on PATH) or a file it reads as code: refused, not guessed at (twelfth
    round)."""
    for word in args:
        if not word.startswith("-"):
            raise UnsafePath(
                f"{what} {path}: its `#!` line hands {runner} the word {shown(word, 80)}, which {runner} "
                "may run as a program or read as code: cannot check what it runs; name the interpreter "
                "by its path (`#!/path/to/python`), with options only"
            )


def _shebang_values(
    words: list[str], ok: frozenset[int], runner: str, what: str, path: str, depth: int, search: str
) -> None:
    """Each word a `#!` line hands its interpreter (options, env -S's NAME=VALUE assignments and its
    program's words) is a value handed to a program, as a `[server] env` value is (fourteenth round):
    the paths it names are held to the value role, a directory with its whole tree (env -S
    `PYTHONPATH=<dir>` or `LD_PRELOAD=<file>`, python's `-Xpycache_prefix=<dir>`), and a name it gives
    that is a program on the PATH it runs with, to the exec role (a copy of env under another name:
    `-S<name>`, `--split-string=<name>`). An option's value may be attached to its letter, after any
    other letters (`-vS<name>`, `-I/x`, `-m<module>`, whose dots are directories): each tail of a
    cluster is read as one. A relative path is read from the working directory of whoever runs it
    ("/" for the server, ours for what reconcile runs)."""
    import shutil

    bases = ("/", os.getcwd())
    for word in words:
        cluster = word[1:] if word.startswith("-") and not word.startswith("--") else ""
        tails = [cluster[i:] for i in range(1, len(cluster))]
        forms = dict.fromkeys([word, *tails, *(t.replace(".", "/") for t in tails)])
        for form in forms:
            problem = env_value_problem(form, ok, bases, depth=-1)
            for name in [] if problem else [n for n in form.split("=") if n and "/" not in n]:
                program = shutil.which(name, path=search)
                if program is not None:
                    try:
                        _resolve_exec(program, ok, "the program", depth + 1, search)
                    except UnsafePath as exc:
                        problem = str(exc)
                        break
            if problem is not None:
                raise UnsafePath(
                    f"{what} {path}: its `#!` line hands {runner} {shown(word, 120)}, which names a path or "
                    f"program another user could change: {problem}"
                )


# How many `#!` lines the exec role follows (a script's interpreter, that one's, ...; `env` runs its
# program with a fresh execve, so a chain through env has no kernel bound): past it, refused.
SHEBANG_DEPTH = 8

# What GNU env's -S reads as quoting, escapes, variables or a comment: a line using them is refused,
# not parsed a second way (env's reading, not ours, decides what runs).
_ENV_SPECIAL = frozenset("'\"\\$#")


def _env_program(arg: str, env: str, what: str, path: str, search: str) -> tuple[str | None, list[str]]:
    """The program `#!ENV ARG` runs (ARG is the one argument the kernel hands env: the rest of the
    line), as a path to judge, and the words env hands it (ARGS); None when env finds none on `search`
    (nothing runs: env fails). Only the plain forms are read: `NAME` (the whole argument, blanks and
    all, as env reads it) and `-S [NAME=VALUE...] NAME ARGS...`, in printable ASCII; anything else env
    might read another way (options, -S attached, after another option or spelled long, quotes,
    `${...}`, a PATH set on the line) is refused, naming the line, rather than guessed at."""

    def refuse(why: str) -> UnsafePath:
        return UnsafePath(
            f"cannot tell which program {env} runs for {what} {path} ({why}): write the line as "
            f"`#!{env} NAME` or `#!{env} -S NAME ARGS`, or name the interpreter by its path"
        )

    if any(not (" " <= c <= "~") and c != "\t" for c in arg):
        raise refuse("characters env may split or read another way")
    words = arg.split()
    if words and words[0] == "-S":
        if _ENV_SPECIAL & set(arg):
            raise refuse("-S with quotes, escapes, ${...} or #")
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("-"):
            if words[0].partition("=")[0] == "PATH":
                raise refuse("PATH set on the line")
            words = words[1:]
        if not words:
            return None, []
        name, args = words[0], words[1:]
    elif not arg:
        return None, []
    else:
        name, args = arg, []  # without -S, env reads the whole argument as one word: blanks and all
    if name.startswith("-") or "=" in name:
        raise refuse(f"option or assignment {name}")
    if "/" in name:
        if not name.startswith("/"):
            raise refuse(f"relative path {name}")
        return name, args
    import shutil

    return shutil.which(name, path=search), args


def open_append(path: str, mode: int = 0o640) -> int:
    """An O_APPEND fd of a log (made with `mode`), never through a symlink, never left writable by
    group or others, and only a regular file of root or us (O_NONBLOCK: a FIFO there never blocks)."""
    try:
        fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a FIFO nobody reads
            raise
        raise UnsafePath(f"{path} is a FIFO, not a regular file: move it aside and re-run") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners():
            raise UnsafePath(f"{path} is not a regular file of root or ours: move it aside and re-run")
        if st.st_mode & 0o022:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
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
