"""A hostile mirror on loopback in front of a FakeHub (tests/fakes/hub_server.py), for the hostile
rounds' download attacks: it accepts connections, reads each request's head, and hands the request
lines to the subclass's `answer`; `forward` passes a request to the hub and returns its whole answer,
`one_answer` rewrites such an answer as the only one on its connection."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit


class Mirror:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def start(self) -> None:
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                head += data
            if head:
                self.answer(conn, head.split(b"\r\n"))

    def answer(self, conn: socket.socket, lines: list[bytes]) -> None:
        raise NotImplementedError

    def forward(self, lines: list[bytes]) -> bytes:
        """The request (its first line and headers) sent on to the hub; the hub's whole answer."""
        kept = [ln for ln in lines[1:] if not ln.lower().startswith((b"connection:", b"host:"))]
        up = urlsplit(self.upstream)
        request = b"\r\n".join([lines[0], f"Host: {up.netloc}".encode(), b"Connection: close", *kept])
        answer = b""
        with socket.create_connection((up.hostname, up.port or 80)) as upstream:
            upstream.sendall(request)
            while data := upstream.recv(65536):
                answer += data
        return answer

    def close(self) -> None:
        self.server.close()


def one_answer(answer: bytes, extra: tuple[bytes, ...] = ()) -> bytes:
    """`answer` with `extra` headers and `Connection: close` (one answer a connection: say so)."""
    top, _, body = answer.partition(b"\r\n\r\n")
    kept = [ln for ln in top.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, *extra, b"Connection: close"]) + b"\r\n\r\n" + body


def path_of(lines: list[bytes]) -> str:
    return lines[0].split(b" ")[1].decode()
