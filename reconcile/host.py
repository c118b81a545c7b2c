"""The one seam between reconcile and the machine: subprocesses, HTTP, atomic file writes.

Probes and actions call these instead of `subprocess`/`http.client` directly, so every command
we run is bounded by a timeout and every write is atomic. Tests run them for real.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket


class ToolMissing(Exception):
    """The executable does not exist (a typed 'unavailable', not a crash)."""


class CommandTimeout(Exception):
    """The command ran past its timeout and was killed."""


class Completed(Record):
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    input: str | None = None,
    cwd: str | None = None,
) -> Completed:
    """Run a command to completion and capture its output (text, errors replaced)."""
    import subprocess  # ~2 ms with its selectors and signals: a warm converged plan runs no command

    try:
        proc = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            input=input,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            cwd=cwd,
            stdin=None if input is not None else subprocess.DEVNULL,
            umask=0o022,  # the system's usual one for the trees tools build (apt, pip, venv), not our 077
        )
    except FileNotFoundError as exc:
        raise ToolMissing(f"{argv[0]}: not found") from exc
    except PermissionError as exc:
        raise ToolMissing(f"{argv[0]}: not executable ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandTimeout(f"{' '.join(argv)}: no answer within {timeout:g}s") from exc
    return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def run_lines(
    argv: Sequence[str],
    *,
    on_line: Callable[[str], None],
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Completed:
    """Run a command, handing each line of its output (stdout and stderr merged, `\\r` ends a line
    too: progress bars) to `on_line` as it comes; the whole output is in `stdout` at the end."""
    import subprocess
    import threading

    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except FileNotFoundError as exc:
        raise ToolMissing(f"{argv[0]}: not found") from exc
    except PermissionError as exc:
        raise ToolMissing(f"{argv[0]}: not executable ({exc.strerror})") from exc
    chunks: list[bytes] = []

    def pump() -> None:
        assert proc.stdout is not None
        pending = b""
        while block := os.read(proc.stdout.fileno(), 65536):
            chunks.append(block)
            *done, pending = (pending + block).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            for line in done:
                if line.strip():
                    on_line(line.decode(errors="replace"))
        if pending.strip():
            on_line(pending.decode(errors="replace"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # as subprocess.run does
        proc.wait()
        raise CommandTimeout(f"{' '.join(argv)}: no answer within {timeout:g}s") from None
    reader.join(timeout=5.0)
    return Completed(tuple(argv), code, b"".join(chunks).decode(errors="replace"), "")


class HttpResponse(Record):
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> object:
        import json

        return json.loads(self.body or b"null")


class HttpUnreachable(Exception):
    """Nothing answered (refused, reset, timed out)."""


def http_request(
    method: str,
    host: str,
    port: int,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 5.0,
    before_send: Callable[[], None] | None = None,
) -> HttpResponse:
    """One HTTP/1.1 request with `Connection: close` over a plain socket. `before_send` runs once the
    connection is made and before a byte is sent; what it raises propagates (the key guard's refusal).

    Not http.client: it imports the email package (~20-30 ms), a tenth of a converged plan, for
    the three loopback GETs the health probe makes.
    """
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal needs brackets
    url = f"http://{shown}:{port}{path}"
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {shown}:{port}",
        "Connection: close",
        "Accept-Encoding: identity",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    chunks: list[bytes] = []
    # An ASCII host as bytes: given a str, getaddrinfo imports the idna codec (~2-4 ms) to encode it.
    address = host.encode("ascii") if host.isascii() else host
    try:
        sock = _connect(address, port, timeout)
        try:
            if before_send is not None:
                before_send()
            sock.sendall(request)
            while data := sock.recv(65536):
                chunks.append(data)
        finally:
            sock.close()
    except OSError as exc:
        raise HttpUnreachable(f"{url}: {exc}") from exc
    head, sep, rest = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split()
    if not sep or len(parts) < 2 or not parts[1].isdigit():
        raise HttpUnreachable(f"{url}: not an HTTP response ({status_line[:80]!r})")
    found = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if found.get("transfer-encoding", "").lower() == "chunked":
        try:
            rest = _dechunk(rest)
        except ValueError:
            raise HttpUnreachable(f"{url}: a malformed chunked body") from None
    elif found.get("content-length", "").isdigit():
        rest = rest[: int(found["content-length"])]
    return HttpResponse(int(parts[1]), rest, found)


def _connect(host: str | bytes, port: int, timeout: float) -> _socket.socket:
    """socket.create_connection, on the C module itself: socket.py (with selectors, array and its
    enums) costs ~3-4 ms to import. Each address in turn; the last one's error when none connects."""
    import _socket

    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = None
        try:
            sock = _socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            error = exc
            if sock is not None:
                sock.close()
    raise error if error is not None else OSError("getaddrinfo returns an empty list")


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: str,
    data: bytes,
    *,
    mode: int | None = None,
    uid: int = -1,
    gid: int = -1,
) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix.

    Temp file in the same directory, mode and owner set before any byte is written (a secret is
    never readable by others, even half-written), fsync, rename, fsync the directory.
    """
    import tempfile

    directory = os.path.dirname(path) or "."
    # mkstemp: a new file (O_EXCL, O_NOFOLLOW), mode 0600, named as the stale-temp sweep knows ours.
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=directory)
    fd_ours = True  # until the file object below owns (and closes) it
    try:
        if mode is None:
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(path).st_mode & 0o7777
        os.fchmod(fd, mode if mode is not None else 0o644)
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        with os.fdopen(fd, "wb") as f:
            fd_ours = False
            f.write(data[: len(data) // 2])
            f.flush()
            checkpoint(f"atomic_write.partial:{os.path.basename(path)}")
            f.write(data[len(data) // 2 :])
            f.flush()
            os.fsync(f.fileno())
        checkpoint(f"atomic_write.rename:{os.path.basename(path)}")
        os.replace(tmp, path)
    except BaseException as exc:
        if fd_ours:  # failed before its first byte: a mode or owner refused, the target a symlink loop
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # ENOSPC on write names no file
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    fsync_dir(directory)


# A temp file of ours: "." + the file's name + ".reconcile-" + the writer's pid + "-" + mkstemp's 8
# random characters + ".tmp". The pid lets a sweep leave the temp of a writer that still runs.
# Compiled on first use (by re's cache): a plan never sweeps temps.
_OWN_TEMP = r"^\.(?P<name>.+)\.reconcile-(?P<pid>[0-9]+)-[a-z0-9_]{8}\.tmp$"


def temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.reconcile-{os.getpid()}-"


def remove_stale_temps(directory: str, names: Collection[str] | None) -> list[str]:
    """Remove the temp files a killed writer of ours left in `directory` (never below it): of the files
    `names` (None: of any file, for a directory only reconcile writes in), whose writer is gone.

    Another program's temp file never matches: the name says "reconcile" and its writer's pid.
    Returns the paths removed.
    """
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for entry in entries:
        m = re.match(_OWN_TEMP, entry)
        if m is None or (names is not None and m.group("name") not in names) or _alive(int(m.group("pid"))):
            continue
        path = os.path.join(directory, entry)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a pid reused by this very process: that writer is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def move_aside(path: str) -> str:
    """Rename a damaged state file to `<path>.corrupt-<time>` (kept for a person to read); returns it."""
    import time

    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.corrupt-{stamp}.{n}"
    os.rename(path, aside)
    return aside


def atomic_symlink(target: str, link: str) -> None:
    """Point `link` at `target` atomically: a new link beside it, then rename over the old one."""
    directory = os.path.dirname(link) or "."
    tmp = os.path.join(directory, f".{os.path.basename(link)}.reconcile-{os.getpid()}.tmp")  # ours alone
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


KILL_AT = "RECONCILE_TEST_KILL_AT"


def checkpoint(label: str) -> None:
    """A named point where the crash-safety tests kill us: SIGKILL to ourselves when the environment
    variable RECONCILE_TEST_KILL_AT equals `label`; a no-op otherwise (one dict lookup)."""
    if os.environ.get(KILL_AT) == label:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
