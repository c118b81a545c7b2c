"""Files from outside read as data: a regular file only (a FIFO, device or socket is refused by name,
never opened), opened non-blocking and without following a link, `fstat`ed, read within a bound;
modes reduced to 0644/0755; copies that keep holes and stop at the size seen. One module, so the
path-trust layer (filesafety) can route every such open through itself in one place.

Used by the model source copy and its hashing walk, the model dir's JSON files, the API key and
`[server] secret_files`.
"""

from __future__ import annotations

import errno
import os
import re
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Any

KEY_LIMIT = 64 * 1024  # an API key or a secret_files token: a few dozen bytes
JSON_LIMIT = 64 << 20  # config.json, the download record (≈200 bytes a file: 300,000 files)
_CHUNK = 1 << 20
_SHRANK = "it shrank while it was read (apply again once it is stable)"
_ZEROS = bytes(_CHUNK)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISREG, "a regular file"),
)


class NotRegular(OSError):
    """A path from outside that is not a regular file (or changed under us); `strerror` says what it
    is: "a FIFO, not a regular file". An OSError, so a caller's `except OSError` names it."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(errno.EINVAL, what, path)


class TooMany(OSError):
    """A tree from outside with more entries than its bound."""

    def __init__(self, path: str, limit: int) -> None:
        what = f"holds more than {limit:,} files and directories: refused (a model is a few hundred at most)"
        super().__init__(errno.EFBIG, what, path)


# A tree from outside (a `[model] source`) is walked, stat'ed and hashed by every plan and copied file by
# file (each fsynced) by apply: its owner choosing its size in files chooses how long root's runs take,
# the apply lock held. Measured on the CI machine: 20,000 empty files made each plan 2.5-4 s and the
# apply 54 s; a million would be minutes a plan. The largest model repositories hold a few hundred.
SOURCE_ENTRIES = 10_000


class TooLarge(OSError):
    """A file from outside larger than its bound."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes, more than such a file holds", path)


def kind(st_mode: int) -> str:
    """What a file is, for a message: "a FIFO", "a character device", "a regular file"."""
    for test, name in _KINDS:
        if test(st_mode):
            return name
    return "not a file"


def not_regular(st_mode: int) -> str | None:
    """None for a regular file, else "a FIFO, not a regular file" (and so on)."""
    return None if stat.S_ISREG(st_mode) else f"{kind(st_mode)}, not a regular file"


def reduced_mode(st_mode: int) -> int:
    """The mode a copy of a file from outside gets: 0755 when any x bit was set, else 0644; never
    setuid, setgid, sticky or writable by others. And never readable by others when the source was
    not (0700/0600 then): a root-only file in the tree (a token, a hard link where the kernel allows
    one to root's file) does not become world-readable by being copied."""
    mode = 0o755 if st_mode & 0o111 else 0o644
    return mode if st_mode & 0o004 else mode & 0o700


def open_regular(
    path: str, *, follow: bool = False, inside: Sequence[str] = ()
) -> tuple[int, os.stat_result]:
    """An fd (blocking again, close-on-exec) of the regular file at `path`, and its fstat.

    Checked before the open (a device's open can act, a FIFO's can wait) and after it on the fd:
    the file opened is the one checked. `follow` = False: a symlink at `path` is refused (O_NOFOLLOW);
    True is for a name whose links the caller has already judged (a source tree's allowed links).
    `inside` (real directories): the file opened must lie below one of them, judged on the fd itself
    (the kernel's name for it), so a link put in place of a judged name since is refused, not read.
    Raises NotRegular, or the OSError of the open (FileNotFoundError for a missing file)."""
    before = os.stat(path) if follow else os.lstat(path)
    if (what := not_regular(before.st_mode)) is not None:
        raise NotRegular(path, what)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link put there since the lstat
            raise NotRegular(path, "a symlink, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if (what := not_regular(st.st_mode)) is not None:
            raise NotRegular(path, what)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegular(path, "replaced while it was opened")
        if inside and not _below(os.readlink(f"/proc/self/fd/{fd}"), inside):
            raise NotRegular(path, "a link leading out of its tree (changed since it was listed)")
        os.set_blocking(fd, True)  # a regular file never blocks; what we hand on behaves as a plain open
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def walk_tree(top: str, limit: int | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(top)` without recursion: top-down, the caller may prune or sort `dirs` in place, a
    link to a directory is listed and not entered, an unreadable directory is passed over. Python
    3.11's os.walk recurses once a level, and the owner of a tree (a model source) can nest it past
    the interpreter's limit well within PATH_MAX (1,100 levels of `a/`): RecursionError, a crash on
    every plan. `limit` (a tree from outside: SOURCE_ENTRIES): TooMany once more entries than that
    were listed, pruned ones included."""
    seen = 0
    stack = [top]
    while stack:
        here = stack.pop()
        dirs: list[str] = []
        files: list[str] = []
        enter: set[str] = set()
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()
                        if is_dir and not entry.is_symlink():
                            enter.add(entry.name)
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else files).append(entry.name)
        except OSError:
            continue
        seen += len(dirs) + len(files)
        if limit is not None and seen > limit:
            raise TooMany(top, limit)
        yield here, dirs, files
        stack.extend(os.path.join(here, d) for d in reversed(dirs) if d in enter)


def _below(real: str, tops: Sequence[str]) -> bool:
    return any(real == top or real.startswith(top.rstrip("/") + "/") for top in tops)


# The deepest a JSON document reconcile takes may nest: the 47 model configs in tests/data nest 5 levels at
# most, the state files a test run leaves 6. json parses up to its own recursion limit (~1,000, less the
# caller's stack), and what reads the document next recurses one to three frames a level (the preflight
# memo's key, DeepDiff in the plan's model.config row, `diff`'s flattening): a config.json of nobody's
# nested 600 deep parsed, then ended every plan in RecursionError (twelfth round).
JSON_DEPTH_MAX = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")  # which kind a bracket is does not change how deep it is


def _nested_past(raw: bytes, limit: int) -> bool:
    """Whether valid JSON `raw` nests deeper than `limit`: its brackets outside strings, each pass taking
    the innermost pairs away, one level (a document of numbers and strings has few brackets, and a wide
    one of many loses them all in the first pass: 8 million `[]` in 0.1 s)."""
    brackets = _JSON_STRING.sub(b"", raw).translate(_AS_SQUARE, _NOT_BRACKET)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def load_json(raw: str | bytes) -> Any:
    """`json.loads` for data from outside reconcile or from its state files: ValueError for anything
    that is not JSON, nesting past the parser's recursion limit included (`[[[[...`, well inside any
    read cap, makes json raise RecursionError, which no caller expects: a crash on every plan), and
    nesting past JSON_DEPTH_MAX, which the code that reads the document next could not walk."""
    import json

    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if isinstance(data, (dict, list)):
        encoded = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        if _nested_past(encoded, JSON_DEPTH_MAX):
            raise ValueError(f"JSON nested deeper than {JSON_DEPTH_MAX} levels")
    return data


def source_roots(source: str) -> list[str]:
    """Where a `[model] source` tree's symlinks may lead: inside it, and for a huggingface_hub cache
    snapshot (<repo>/snapshots/<rev>, every file a link to ../../blobs/...) into that repo's blobs.
    `source` is the real path the data role reached (filesafety.data_root), taken as it is, never
    resolved by name again: the tree's owner who makes its top (or a directory above it of theirs) a
    link since leads every file out of it, refused, not a new tree of their choosing read as theirs."""
    real = os.path.normpath(source)
    roots = [real]
    if os.path.basename(os.path.dirname(real)) == "snapshots":
        roots.append(os.path.join(os.path.dirname(os.path.dirname(real)), "blobs"))
    return roots


def tree_stat(path: str, tree: str, name: str | None = None) -> os.stat_result:
    """The stat of a file in `tree` (a `[model] source`: another user's data) through its links, only
    when they lead inside it (source_roots): a link out is NotRegular ("a symlink to X, outside the
    source"), never stat'ed, hashed or read there; so is a FIFO, device or socket. Every walk of a
    source (the realization's address, the plan's drift, the copy) judges its entries by this."""
    real = os.path.realpath(path)
    if not _below(real, source_roots(tree)):
        raise NotRegular(name or path, f"a symlink to {real}, outside the source")
    st = os.stat(real)
    if (what := not_regular(st.st_mode)) is not None:
        raise NotRegular(name or path, what)
    return st


def read_regular(path: str, limit: int, *, follow: bool = False, tree: str | None = None) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them (TooLarge beyond). With
    `tree` (a `[model] source`: another user's data), links are followed only inside it
    (source_roots), judged on the descriptor opened: a link to a file only root may read is
    NotRegular, never read (its values would reach root's plan)."""
    if tree is not None:
        fd, _st = open_regular(os.path.realpath(path), inside=source_roots(tree))
    else:
        fd, _st = open_regular(path, follow=follow)
    try:
        parts, have = [], 0
        while have <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - have))):
            parts.append(chunk)
            have += len(chunk)
    finally:
        os.close(fd)
    if have > limit:
        raise TooLarge(path, limit)
    return b"".join(parts)


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) ranges of `fd` below `size` that hold data; the rest are holes (read as zeros).
    Where the filesystem cannot say (no SEEK_DATA), one range: all of it."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole from here to the end
                    break
                raise
            if start >= size:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            ranges.append((start, end))
            offset = end
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return [(0, size)] if size else []
    return ranges


def sha256_fd(fd: int, size: int) -> str:
    """The sha256 of the first `size` bytes of `fd` (the size fstat saw: a file that grows while it is
    read is hashed as it was), holes hashed as the zeros they read as, without reading them."""
    import hashlib  # OpenSSL; ~3-5 ms to import, so only when a file is hashed

    h = hashlib.sha256()
    offset = 0
    for start, end in data_ranges(fd, size):
        _zeros(h.update, start - offset)
        for chunk in _chunks(fd, start, end):
            h.update(chunk)
        offset = end
    _zeros(h.update, size - offset)
    return h.hexdigest()


def copy_fd(src: int, dst: int, size: int) -> None:
    """Copy the first `size` bytes of `src` into the empty file `dst`, holes kept as holes: a sparse
    file stays sparse, and a file that grows meanwhile is copied as fstat saw it."""
    for start, end in data_ranges(src, size):
        offset = _in_kernel(src, dst, start, end)
        for chunk in _chunks(src, offset, end):  # what copy_file_range could not do (another fs)
            view = memoryview(chunk)
            while view:
                n = os.pwrite(dst, view, offset)
                view, offset = view[n:], offset + n
    os.ftruncate(dst, size)


_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM)


def _in_kernel(src: int, dst: int, start: int, end: int) -> int:
    """Copy [start, end) with copy_file_range (no trip through Python; a reflink where the filesystem
    has them); returns where it stopped: `end`, or earlier where the kernel declined (EXDEV...)."""
    offset = start
    while offset < end:
        try:
            n = os.copy_file_range(src, dst, end - offset, offset, offset)
        except OSError as exc:
            if exc.errno in _NO_KERNEL_COPY:
                return offset
            raise
        if n == 0:
            raise OSError(errno.EAGAIN, _SHRANK)
        offset += n
    return offset


def _chunks(fd: int, start: int, end: int) -> Iterator[bytes]:
    offset = start
    while offset < end:
        chunk = os.pread(fd, min(_CHUNK, end - offset), offset)
        if not chunk:  # shrank since its fstat: what was seen is gone, so no copy or hash of it
            raise OSError(errno.EAGAIN, _SHRANK)
        yield chunk
        offset += len(chunk)


def _zeros(update: Callable[[bytes], object], n: int) -> None:
    while n > 0:
        update(_ZEROS[: min(n, _CHUNK)])
        n -= _CHUNK


def past_free_space(directory: str, need: Mapping[str, int]) -> str | None:
    """Why the files `need` (name -> bytes, by apparent size) cannot be written under `directory`
    (which may not exist yet): their total is more than its filesystem's free space; None if it fits."""
    total = sum(need.values())
    if not total:
        return None
    where = directory
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    free = free_bytes(where)
    if total <= free:
        return None
    largest = max(need, key=lambda n: need[n])
    return (
        f"the files to write are {human(total)} ({largest}: {human(need[largest])}), more than the "
        f"{human(free)} free on {where}'s filesystem"
    )


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"


def free_bytes(directory: str) -> int:
    """Bytes an ordinary write may still use on `directory`'s filesystem (statvfs f_bavail: the
    filesystem's reserve for root stays untouched)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
