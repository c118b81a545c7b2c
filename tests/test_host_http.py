"""reconcile.host.http_request against a real HTTP server on loopback (plain, chunked, refused)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reconcile.host import HttpUnreachable, http_request


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
