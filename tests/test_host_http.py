"""reconcile.host.http_request against a real HTTP server on loopback (plain, chunked, refused)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reconcile.host import HttpResponse, HttpTooLarge, HttpTooSlow, HttpUnreachable, http_request


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"a": ', b"[1, 2]", b"}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        auth = self.headers.get("Authorization")
        body = json.dumps({"path": self.path, "auth": auth}).encode()
        self.send_response(200 if auth == "Bearer k" else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_get_with_and_without_the_key(server: int) -> None:
    ok = http_request("GET", "127.0.0.1", server, "/v1/models", headers={"Authorization": "Bearer k"})
    assert ok.status == 200 and ok.json() == {"path": "/v1/models", "auth": "Bearer k"}
    assert ok.headers["content-length"] == str(len(ok.body))
    assert http_request("GET", "127.0.0.1", server, "/v1/models").status == 401


def test_chunked_body_is_reassembled(server: int) -> None:
    assert http_request("GET", "127.0.0.1", server, "/chunked").json() == {"a": [1, 2]}


def test_post_sends_the_body(server: int) -> None:
    assert http_request("POST", "127.0.0.1", server, "/echo", body=b'{"x": 1}').body == b'{"x": 1}'


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HttpUnreachable, match="refused"):
        http_request("GET", "127.0.0.1", port, "/health", timeout=1)


# --- issue 24: a total deadline and a body cap ----------------------------------------------------


def _serve_once(steps: list[tuple[bytes, float]], hold: float = 30.0) -> int:
    """A listener thread for one connection: each (bytes, pause) in turn, then the connection held open."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            for data, pause in steps:
                conn.sendall(data)
                time.sleep(pause)
            conn.settimeout(hold)
            conn.recv(1)  # until the client closes (or `hold` passes)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(srv.getsockname()[1])


def _timed(port: int, **kw: Any) -> tuple[float, Exception | HttpResponse]:
    started = time.monotonic()
    try:
        got: Exception | HttpResponse = http_request("GET", "127.0.0.1", port, "/health", **kw)
    except HttpUnreachable as exc:
        got = exc
    return time.monotonic() - started, got


def test_a_dripping_answer_is_cut_off_at_the_total_deadline() -> None:
    drip = [(b"HTTP/1.1 200 OK\r\n", 0.3)] + [(b"X", 0.3)] * 100  # each read well within the timeout
    took, got = _timed(_serve_once(drip), timeout=1.5)
    assert isinstance(got, HttpTooSlow) and 1.4 < took < 3, (took, got)
    assert str(got).endswith("/health: no complete answer within 1.5 s (slow or stuck listener)")


def test_a_listener_that_never_answers_is_cut_off_at_the_deadline() -> None:
    took, got = _timed(_serve_once([]), timeout=1)
    assert isinstance(got, HttpTooSlow) and took < 2.5, (took, got)


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_read() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n"
    took, got = _timed(_serve_once([(head, 0)]), timeout=5)
    assert isinstance(got, HttpTooLarge) and took < 1, (took, got)
    assert "answer larger than 1 MiB (Content-Length: 1099511627776): refused" in str(got)


@pytest.mark.parametrize("framing", ["chunked", "unframed"])
def test_an_endless_body_is_refused_at_the_cap(framing: str) -> None:
    block = b"A" * 65536
    if framing == "chunked":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        block = b"10000\r\n" + block + b"\r\n"
    else:
        head = b"HTTP/1.1 200 OK\r\n\r\n"
    took, got = _timed(_serve_once([(head, 0)] + [(block, 0)] * 100), timeout=5, limit=256 << 10)
    assert isinstance(got, HttpTooLarge) and took < 2, (took, got)
    assert str(got).endswith("/health: answer larger than 256 KiB: refused")


def test_one_byte_chunks_are_counted_by_what_they_decode_to() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"1\r\nA\r\n" * 2000 + b"0\r\n\r\n"
    _took, got = _timed(_serve_once([(head + body, 0)]), timeout=5, limit=2000)
    assert isinstance(got, HttpResponse) and got.body == b"A" * 2000


def test_endless_headers_are_refused() -> None:
    steps = [(b"HTTP/1.1 200 OK\r\n", 0)] + [(b"X-A: " + b"a" * 8000 + b"\r\n", 0)] * 100
    _took, got = _timed(_serve_once(steps), timeout=5)
    assert isinstance(got, HttpTooLarge) and "answer headers larger than 64 KiB: refused" in str(got)


@pytest.mark.parametrize("size", [b"-5", b"+5", b"0x5", b"5_0", b"zz", b"1" * 20])
def test_a_chunk_size_that_is_not_plain_hex_is_malformed(size: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n"
    _took, got = _timed(_serve_once([(answer, 0)]), timeout=5)
    assert isinstance(got, HttpUnreachable) and "malformed chunked body" in str(got), got


def test_a_complete_answer_returns_without_waiting_for_the_close() -> None:
    answer = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"ok": true}'
    took, got = _timed(_serve_once([(answer, 0)]), timeout=5)
    assert isinstance(got, HttpResponse) and got.json() == {"ok": True} and took < 1, (took, got)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 2\xb2\xb2 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
        b"HTTP/1.1 -200 X\r\n\r\n",
    ],
)
def test_digits_that_are_not_ascii_are_not_an_answer(head: bytes) -> None:
    _took, got = _timed(_serve_once([(head, 0)]), timeout=5)
    assert type(got) is HttpUnreachable, got


def test_json_nested_too_deeply_is_not_json() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        HttpResponse(200, b"[" * 500_000, {}).json()


@pytest.mark.parametrize(
    ("path", "capped"),
    [
        ("/api/models/org/x/revision/main", True),
        ("/hf/api/models/org/x", True),  # a mirror under a prefix
        ("/org/x/resolve/abc/model.safetensors", False),
        ("/org/x/resolve/abc/api/x.json", False),  # a file that happens to sit under api/
    ],
)
def test_only_the_hubs_api_answers_are_capped(path: str, capped: bool) -> None:
    from types import SimpleNamespace

    from reconcile.host import _is_api

    assert _is_api(SimpleNamespace(path=path)) is capped
