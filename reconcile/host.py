"""The one seam between reconcile and the machine: subprocesses, HTTP, atomic file writes.

Probes and actions call these instead of `subprocess`/`http.client` directly, so every command
we run is bounded by a timeout, every HTTP exchange by a deadline and a body cap, and every write is
atomic. Tests run them for real.
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
    from collections.abc import Iterator
    from typing import Any, TypeVar

    T = TypeVar("T")


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


_PROGRAM_CHECK: list[Callable[..., object]] = []


def check_programs(check: Callable[..., object]) -> None:
    """Set the check every program found on PATH must pass before it runs (the CLI sets the exec role,
    filesafety.resolve_exec, at start: host and the trust layer are peers). It is called with the
    program and `search=` the PATH it runs with (where a `#!/usr/bin/env` line's program is found),
    and raises to refuse."""
    _PROGRAM_CHECK[:] = [check]


def _program(name: str, env: Mapping[str, str] | None) -> str | None:
    """The file a command named `name` runs, after the program check (the exec role): for a bare name,
    where PATH has it (PATH's directories pass the read role at start, but a file in them may still be
    another user's: a tarball's owners kept); for a path, that path. A caller that looked a program up
    itself (shutil.which("uv")) hands an absolute path, which is held to the same check: no program
    root runs skips it. None: no check installed (a library use), run as given."""
    if not _PROGRAM_CHECK:
        return None
    search = (os.environ if env is None else env).get("PATH", os.defpath)
    if "/" in name:
        try:  # every link on the way was judged by the walk: the name runs what was checked
            _PROGRAM_CHECK[0](name if name.startswith("/") else os.path.join("/", name), search=search)
        except Exception as exc:
            raise ToolMissing(f"{name}: not run: {exc}") from None
        return name
    import shutil

    found = shutil.which(name, path=search)
    if found is None:
        raise ToolMissing(f"{name}: not found")
    try:
        _PROGRAM_CHECK[0](found, search=search)
    except Exception as exc:
        raise ToolMissing(f"{name}: {found} not run: {exc}") from None
    return found


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

    program = _program(argv[0], env) if argv else None
    try:
        proc = subprocess.run(
            list(argv),
            executable=program,  # the file checked, argv[0] as given
            env=dict(env) if env is not None else None,
            input=input,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            cwd=cwd or "/",  # never the caller's: see run_lines
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

    program = _program(argv[0], env) if argv else None
    try:
        proc = subprocess.Popen(
            list(argv),
            executable=program,  # the file checked, argv[0] as given
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # In /, not reconcile's own directory (the timer's is the spec's): `python -c` and
            # `python -m pip` put their current directory first on sys.path, and a .py there would be
            # imported by root's pip or the venv's python.
            cwd="/",
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
        """The body as JSON; ValueError when it is not, or when it nests past what reconcile takes
        (untrusted.load_json: within the 1 MiB cap, `[[[[...` made json raise RecursionError)."""
        from reconcile.safety.untrusted import load_json

        return load_json(self.body or b"null")


class HttpUnreachable(Exception):
    """No usable answer: refused, reset, not HTTP, too slow or too large (the two subclasses)."""


class HttpTooSlow(HttpUnreachable):
    """The exchange's deadline passed before the answer was complete (a slow or stuck listener)."""


class HttpTooLarge(HttpUnreachable):
    """The answer's body (or its head) is larger than the request's cap: refused, not read on."""


JSON_LIMIT = 1 << 20  # a JSON endpoint's answer (/health, /version, /v1/models, a chat): 1 MiB
HEAD_LIMIT = 64 << 10  # the status line and headers
_CHUNK_LINE_LIMIT = 4096  # a chunk-size line, extensions included
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit: it takes "²", which int() refuses
_STATUS = re.compile(r"[0-9]{3}")


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def http_request(
    method: str,
    host: str,
    port: int,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 5.0,
    limit: int = JSON_LIMIT,
    before_send: Callable[[], None] | None = None,
) -> HttpResponse:
    """One HTTP/1.1 request with `Connection: close` over a plain socket. `before_send` runs once the
    connection is made and before a byte is sent; what it raises propagates (the key guard's refusal).

    `timeout` is the whole exchange's deadline (connect, send and every read together), not a
    per-read timeout: a listener that drips a byte every second is cut off when it passes
    (HttpTooSlow). `limit` caps the body (HttpTooLarge): a Content-Length above it is refused
    before the body is read, a chunked or unframed body as soon as it grows past it.

    Not http.client: it imports the email package (~20-30 ms), a tenth of a converged plan, for
    the three loopback GETs the health probe makes.
    """
    import time

    deadline = time.monotonic() + timeout
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal needs brackets
    unix = host.startswith("/")  # a Unix socket's path (reconcile.identity.endpoint: a color's)
    url = f"http://unix:{host}:{path}" if unix else f"http://{shown}:{port}{path}"
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost" if unix else f"Host: {shown}:{port}",
        "Connection: close",
        "Accept-Encoding: identity",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    # An ASCII host as bytes: given a str, getaddrinfo imports the idna codec (~2-4 ms) to encode it.
    address = host.encode("ascii") if host.isascii() else host
    try:
        sock = _connect_unix(host, deadline) if unix else _connect(address, port, deadline)
    except TimeoutError:
        raise HttpTooSlow(f"{url}: no connection within {timeout:g} s") from None
    except OSError as exc:
        raise HttpUnreachable(f"{url}: {exc}") from exc
    try:
        if before_send is not None:
            before_send()
        _settimeout(sock, deadline)
        sock.sendall(request)
        return _answer(_Reader(sock, deadline), limit, url)
    except TimeoutError:
        raise HttpTooSlow(
            f"{url}: no complete answer within {timeout:g} s (slow or stuck listener)"
        ) from None
    except OSError as exc:
        raise HttpUnreachable(f"{url}: {exc}") from exc
    finally:
        sock.close()


def _settimeout(sock: _socket.socket, deadline: float) -> None:
    import time

    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)


class _Reader:
    """recv() under the exchange's deadline: each read may wait only for what is left of it."""

    def __init__(self, sock: _socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def recv(self, size: int = 65536) -> bytes:
        _settimeout(self.sock, self.deadline)
        return self.sock.recv(size)


def _answer(reader: _Reader, limit: int, url: str) -> HttpResponse:
    buf = bytearray()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > HEAD_LIMIT:
            raise HttpTooLarge(f"{url}: answer headers larger than {size_text(HEAD_LIMIT)}: refused")
        data = reader.recv()
        if not data:
            break
        buf += data
    head = bytes(buf[:end] if end >= 0 else buf[:200])
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split()
    if end < 0 or len(parts) < 2 or not _STATUS.fullmatch(parts[1]):
        raise HttpUnreachable(f"{url}: not an HTTP response ({status_line[:80]!r})")
    del buf[: end + 4]
    found = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}

    def too_large(declared: str = "") -> HttpTooLarge:
        return HttpTooLarge(f"{url}: answer larger than {size_text(limit)}{declared}: refused")

    if found.get("transfer-encoding", "").lower() == "chunked":
        try:
            body = _dechunk(buf, reader, limit)
        except ValueError:
            raise HttpUnreachable(f"{url}: a malformed chunked body") from None
        except OverflowError:
            raise too_large() from None
    elif "content-length" in found:
        declared = found["content-length"]
        if not _DIGITS.fullmatch(declared):
            raise HttpUnreachable(f"{url}: a malformed Content-Length ({declared[:40]!r})")
        if len(declared) > 18 or int(declared) > limit:
            raise too_large(f" (Content-Length: {declared[:40]})")
        want = int(declared)
        while len(buf) < want and (data := reader.recv(min(65536, want - len(buf)))):
            buf += data
        body = bytes(buf[:want])
    else:  # the body ends when the listener closes
        while data := reader.recv():
            buf += data
            if len(buf) > limit:
                raise too_large()
        body = bytes(buf)
    return HttpResponse(int(parts[1]), body, found)


def _connect(host: str | bytes, port: int, deadline: float) -> _socket.socket:
    """socket.create_connection, on the C module itself: socket.py (with selectors, array and its
    enums) costs ~3-4 ms to import. Each address in turn, within what is left of the deadline; the
    last one's error when none connects."""
    import _socket

    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = None
        try:
            sock = _socket.socket(family, kind, proto)
            _settimeout(sock, deadline)
            sock.connect(address)
            return sock
        except OSError as exc:
            error = exc
            if sock is not None:
                sock.close()
            if isinstance(exc, TimeoutError):
                break
    raise error if error is not None else OSError("getaddrinfo returns an empty list")


def _connect_unix(path: str, deadline: float) -> _socket.socket:
    """A connection to the Unix socket at `path`, within the deadline."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        _settimeout(sock, deadline)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _dechunk(buf: bytearray, reader: _Reader, limit: int) -> bytes:
    """A chunked body, decoded as it arrives (ValueError: malformed; OverflowError: over `limit`).
    What is kept is the body so far and one chunk's framing, however the listener frames it."""
    out = bytearray()
    while True:
        while (i := buf.find(b"\r\n")) < 0:
            if len(buf) > _CHUNK_LINE_LIMIT:
                raise ValueError("a chunk-size line too long")
            data = reader.recv()
            if not data:
                raise ValueError("the body ends inside a chunk-size line")
            buf += data
        digits = bytes(buf[:i]).split(b";")[0].strip()
        if not _HEX.fullmatch(digits):
            raise ValueError(f"not a chunk size: {digits[:20]!r}")
        size = int(digits, 16)
        del buf[: i + 2]
        if size == 0:
            return bytes(out)  # trailers, if any, are not read
        if len(out) + size > limit:
            raise OverflowError
        while len(buf) < size + 2:
            data = reader.recv(min(65536, size + 2 - len(buf)))
            if not data:
                raise ValueError("the body ends inside a chunk")
            buf += data
        out += buf[:size]
        del buf[: size + 2]


HUB_API_LIMIT = 16 << 20  # a listing with every file's metadata: ~300 bytes a file
HUB_API_DEADLINE_S = 60.0


def hub_api_call(call: Callable[[], T], what: str, deadline_s: float = HUB_API_DEADLINE_S) -> T:
    """`call` (a huggingface_hub API call: a repo's listing) under a total deadline and a body cap.

    huggingface_hub's own `timeout` bounds each read, so a hub or mirror that drips its answer holds
    the call for ever: it runs in a thread, given up on at the deadline (HttpTooSlow). Its answers to
    `/api/` are read through a counter (_bound_api_answer) that refuses more than HUB_API_LIMIT
    bytes (HttpTooLarge), and a compressed one, whose size on the wire says nothing of its size.
    Downloads (`/resolve/`) are not capped: they are as large as the model, and stream to disk.
    """
    bound_hub_session()
    done, value = in_thread(call, "hub-api", deadline_s)
    if not done:  # left to its own per-read timeout; its body is capped all the same
        raise HttpTooSlow(f"{what}: no complete answer within {deadline_s:g} s (slow or stuck hub)")
    return value  # type: ignore[return-value]


def in_thread(call: Callable[[], T], name: str, timeout: float | None = None) -> tuple[bool, T | None]:
    """(True, call()) run in a daemon thread of its own, its exception raised here; (False, None) when
    `timeout` passed first (the thread is left to end by itself: a daemon never holds the exit)."""
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return True, value


DOWNLOAD_LEAST_RATE = 64 << 10  # bytes a second, over each window: a 10 GB model in at most ~45 h
DOWNLOAD_WINDOW_S = 15.0


def bound_hub_session() -> None:
    """Put the bounds on huggingface_hub's shared client (idempotent), through its own hook
    (`set_client_factory`): hf's default client, with
    - API answers capped (_bound_api_answer), every other answer's body (a download, `/resolve/` or
      the CDN it redirects to) held to a least rate (_bound_download): huggingface_hub's own timeout
      bounds each read only, so a mirror that dripped 1 KiB a second held apply (and its lock) for as
      long as the model took at that rate; each window of DOWNLOAD_WINDOW_S must bring
      DOWNLOAD_LEAST_RATE a second, else HttpTooSlow, which is not retried;
    - every connection made through _HubBackend: each answer's status line and headers must have come
      DOWNLOAD_HEAD_S after its request (a mirror that drips them a byte every 2 s, which no per-read
      timeout sees and no body rate reaches, held apply ~10 min a request), and no read outlives the
      deadline of the download around it (hub_deadline): every socket read is bounded by it, so
      huggingface_hub's worker threads end with the call instead of being joined at exit."""
    import huggingface_hub
    from huggingface_hub import constants

    # hf_xet (Rust, its own sockets) would download a file whose HEAD names a Xet hash from the CAS
    # server a token route names: none of the bounds here reach it, and a mirror chooses that server
    # (one that accepts and never answers held apply past 60 s). The hub serves every file over
    # /resolve/ as well: HF_HUB_DISABLE_XET, read at call time through this constant.
    constants.HF_HUB_DISABLE_XET = True
    if not _BOUNDED:
        huggingface_hub.set_client_factory(_bounded_hub_client)  # closes the client made before, if any
        _BOUNDED.append(True)


_BOUNDED: list[bool] = []


def _bounded_hub_client() -> Any:
    from huggingface_hub.utils import _http  # hf's own client (offline mode, request ids), then ours

    client = _http.default_client_factory()
    pools = [getattr(t, "_pool", None) for t in (client._transport, *client._mounts.values())]
    for pool in pools:  # httpcore's ConnectionPool (and its proxies) take their backend from here
        if pool is None or not hasattr(pool, "_network_backend"):
            raise RuntimeError("huggingface_hub's client has no httpcore pool to bound: unsupported version")
        pool._network_backend = _hub_backend()
    hooks = client.event_hooks
    hooks["request"].append(_identity_for_api)
    hooks["response"] += [_bound_api_answer, _bound_download]
    return client


DOWNLOAD_HEAD_S = 60.0  # a status line and headers: hf's own per-read timeout is 10 s
DOWNLOAD_BASE_S = 300.0  # a whole download's deadline: this, DOWNLOAD_PER_FILE_S a file, the bytes at
DOWNLOAD_PER_FILE_S = 30.0  # the least rate (download_deadline_s)


def download_deadline_s(sizes: Collection[int]) -> float:
    """The deadline of a download of files of these (listed) sizes, retries included."""
    return DOWNLOAD_BASE_S + DOWNLOAD_PER_FILE_S * len(sizes) + sum(sizes) / DOWNLOAD_LEAST_RATE


_HUB_DEADLINE: list[tuple[float, str]] = []  # (monotonic deadline, what) of the download now running


@contextlib.contextmanager
def hub_deadline(seconds: float, what: str, sizes: Mapping[str, int] | None = None) -> Iterator[None]:
    """Every hub exchange inside ends by `seconds` from now: a read still waiting then raises
    HttpTooSlow in its own thread (its socket's timeout is the time left), and no new connection
    is made after it. `sizes` (file name -> listed size): no file's body may be longer."""
    import time

    _HUB_DEADLINE.append((time.monotonic() + seconds, f"{what}: not complete within {seconds:.0f} s"))
    _HUB_SIZES.append(dict(sizes or {}))
    try:
        yield
    finally:
        _HUB_DEADLINE.pop()
        _HUB_SIZES.pop()
        _REDIRECTED.clear()


def _hub_backend() -> Any:
    import importlib

    try:  # huggingface_hub 2.x: httpx2 on httpcore2; 1.x: httpx on httpcore
        httpcore: Any = importlib.import_module("httpcore2")
    except ImportError:
        httpcore = importlib.import_module("httpcore")

    class Backend(httpcore.SyncBackend):  # type: ignore[misc]
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, **kw: Any) -> Any:
            limit, why = _hub_limit(None, "")
            return _BoundedStream(super().connect_tcp(host, port, _capped(timeout, limit, why), **kw))

    return Backend()


def _hub_limit(head_by: float | None, head_why: str) -> tuple[float | None, str]:
    """The earliest of the download's deadline and the head's; past it, HttpTooSlow."""
    import time

    limits = [(head_by, head_why)] if head_by is not None else []
    limits += _HUB_DEADLINE[-1:]
    if not limits:
        return None, ""
    limit, why = min(limits)
    if time.monotonic() >= limit:
        raise HttpTooSlow(f"{why} (a slow or stuck hub or mirror): given up")
    return limit, why


def _capped(timeout: float | None, limit: float | None, why: str) -> float | None:
    import time

    if limit is None:
        return timeout
    left = max(0.001, limit - time.monotonic())
    return left if timeout is None else min(timeout, left)


class _BoundedStream:
    """httpcore's network stream with the head and download deadlines on every read and write."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.head_by: float | None = None
        self.head_why, self.tail = "", b""

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import time

        limit, why = _hub_limit(None, "")
        self._timed(lambda t: self.stream.write(buffer, t), timeout, limit, why)
        if self.head_by is None:  # a request sent: its answer's head is awaited
            self.head_by, self.tail = time.monotonic() + DOWNLOAD_HEAD_S, b""
            self.head_why = f"no status line and headers within {DOWNLOAD_HEAD_S:g} s of the request"

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        limit, why = _hub_limit(self.head_by, self.head_why)
        data: bytes = self._timed(lambda t: self.stream.read(max_bytes, t), timeout, limit, why)
        if self.head_by is not None:
            seen = self.tail + data
            if b"\r\n\r\n" in seen:
                self.head_by = None
            self.tail = seen[-3:]
        return data

    @staticmethod
    def _timed(call: Callable[[float | None], T], timeout: float | None, limit: float | None, why: str) -> T:
        import time

        try:
            return call(_capped(timeout, limit, why))
        except Exception:
            if limit is not None and time.monotonic() >= limit:
                raise HttpTooSlow(f"{why} (a slow or stuck hub or mirror): given up") from None
            raise

    def close(self) -> None:
        self.stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> Any:
        limit, why = _hub_limit(None, "")
        tls = self._timed(
            lambda t: self.stream.start_tls(ssl_context, server_hostname, t), timeout, limit, why
        )
        return _BoundedStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


def _bound_download(response: Any) -> None:
    if _is_api(response.request.url):
        return
    url = response.request.url
    what = f"{url.copy_with(query=None)}"
    name = _download_name(url)
    if response.is_redirect and name is not None and "location" in response.headers:
        _REDIRECTED[str(url.join(response.headers["location"]))] = name  # the CDN's answer: this file
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # httpx would inflate it: its size on the wire says nothing
        raise HttpTooLarge(f"{what}: a {encoding[:20]!r}-encoded file (asked for identity): refused")
    sizes = _HUB_SIZES[-1] if _HUB_SIZES else {}
    limit = sizes.get(name) if name is not None else None
    if limit is None and sizes:  # a file the listing does not name: no larger than its largest
        limit = max(sizes.values())
    stream = response.stream
    base = next((c for c in type(stream).__mro__ if c.__name__ == "SyncByteStream"), object)
    rated = _RATED.get(base) or _RATED.setdefault(base, type("RatedStream", (_RatedStream, base), {}))
    response.stream = rated(stream, what, limit)


_REDIRECTED: dict[str, str] = {}  # a redirect's target URL -> the file of the /resolve/ that led there
_HUB_SIZES: list[dict[str, int]] = []  # the listed sizes of the download now running (hub_deadline)


def _download_name(url: Any) -> str | None:
    """The repo file a download answers: `.../resolve/<revision>/<name>`, or a redirect's target."""
    from urllib.parse import unquote

    path = str(url.path)
    if "/resolve/" in path:
        _, _, tail = path.partition("/resolve/")
        return unquote(tail.partition("/")[2]) or None
    return _REDIRECTED.get(str(url))


_RATED: dict[type, type] = {}


class _RatedStream:
    """A download's body that raises HttpTooSlow when a window brings less than the least rate, and
    HttpTooLarge past `limit` bytes (the file's listed size: huggingface_hub writes what comes and
    compares sizes only at the end, so a mirror could fill the disk the free-space check judged)."""

    def __init__(self, stream: Any, what: str, limit: int | None = None) -> None:
        self.stream, self.what, self.limit, self.total = stream, what, limit, 0

    def __iter__(self) -> Iterator[bytes]:
        import time

        start, got = time.monotonic(), 0
        for chunk in self.stream:
            got += len(chunk)
            self.total += len(chunk)
            if self.limit is not None and self.total > self.limit:
                self.close()
                raise HttpTooLarge(
                    f"{self.what}: more than the {size_text(self.limit)} the hub lists for it: refused"
                )
            now = time.monotonic()
            if now - start >= DOWNLOAD_WINDOW_S:
                if got < DOWNLOAD_LEAST_RATE * (now - start):
                    self.close()
                    raise HttpTooSlow(
                        f"{self.what}: {size_text(got)} in {now - start:.0f} s, under the least rate "
                        f"of {size_text(DOWNLOAD_LEAST_RATE)}/s (a slow or stuck hub or mirror): given up"
                    )
                start, got = now, 0
            yield chunk

    def close(self) -> None:
        self.stream.close()


def _is_api(url: Any) -> bool:
    """An API answer (JSON), not a file: a mirror may serve the hub under a prefix (/hf/api/...), and a
    repo may hold a file under api/ (.../resolve/main/api/x.json)."""
    path = str(url.path)
    return "/api/" in path and "/resolve/" not in path


def _identity_for_api(request: Any) -> None:
    """Every answer uncompressed (API answers and files alike): their caps count what is written."""
    request.headers["Accept-Encoding"] = "identity"


def _bound_api_answer(response: Any) -> None:
    if not _is_api(response.request.url):
        return
    what = f"{response.request.url.copy_with(query=None)}"
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise HttpTooLarge(f"{what}: a {encoding[:20]!r}-encoded answer (asked for identity): refused")
    declared = response.headers.get("content-length", "")
    if _DIGITS.fullmatch(declared) and (len(declared) > 18 or int(declared) > HUB_API_LIMIT):
        cap = size_text(HUB_API_LIMIT)
        raise HttpTooLarge(f"{what}: answer larger than {cap} (Content-Length: {declared[:40]}): refused")
    # The client reads only a SyncByteStream of its own httpx (httpx, or httpx2 for huggingface_hub 2.x)
    stream = response.stream
    base = next((c for c in type(stream).__mro__ if c.__name__ == "SyncByteStream"), object)
    capped = _CAPPED.get(base) or _CAPPED.setdefault(base, type("CappedStream", (_CappedStream, base), {}))
    response.stream = capped(stream, HUB_API_LIMIT, what)


_CAPPED: dict[type, type] = {}


class _CappedStream:
    """A response body that raises HttpTooLarge once more than `limit` bytes have come."""

    def __init__(self, stream: Any, limit: int, what: str) -> None:
        self.stream, self.limit, self.what, self.seen = stream, limit, what, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            self.seen += len(chunk)
            if self.seen > self.limit:
                self.close()
                raise HttpTooLarge(f"{self.what}: answer larger than {size_text(self.limit)}: refused")
            yield chunk

    def close(self) -> None:
        self.stream.close()


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
_OWN_TEMP = r"^\.(?P<name>.+)\.reconcile-(?P<pid>[0-9]+)-[a-z0-9_]{8}\.tmp\Z"


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
    """Whether the writer whose pid a temp file's name holds still runs. The name is data: the key's
    `owner` may own its directory and name a file there `.api.key.reconcile-4294967296-...tmp`; a pid
    no process can have (0, past pid_max: os.kill raised OverflowError, an internal error on every
    apply) is a writer that is gone."""
    from reconcile.safety.shapes import is_pid

    if not is_pid(pid) or pid == os.getpid():  # or a pid reused by this very process
        return False
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
