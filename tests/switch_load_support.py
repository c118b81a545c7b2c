"""A load of streamed chats through a switch, as the reference's 8 concurrent streams: each client
opens a new connection per request and retries a refused one (ECONNREFUSED, or a reset before any
byte was sent: one the closing listener had queued) after 50 ms. Counts, per phase: requests
that finished whole, cut ones (finish_reason abort, or the stream broke off), failed ones (an error
status, a reset before any answer), refused connections, and the longest run of refusals (the gap).
Used by tests/test_switch_load.py, tests/test_gpu_lab_switch.py and benchmarks/bench_switch_load.py."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Tally:
    ok: int = 0
    cut: int = 0
    failed: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)


class Load:
    def __init__(
        self, port: int, key: str, model: str, *, clients: int = 8, tokens: int = 150, host: str = "127.0.0.1"
    ) -> None:
        self.port, self.key, self.model, self.tokens, self.host = port, key, model, tokens, host
        self.phase = "before"
        self.tallies: dict[str, Tally] = {}
        self.attempts: list[tuple[float, bool]] = []  # (when, accepted) of every connection attempt
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(120)

    def tally(self, phase: str) -> Tally:
        return self.tallies.setdefault(phase, Tally())

    def gap(self) -> float:
        """The longest time from a refused connection to the next accepted one (0: none refused)."""
        longest, since = 0.0, None
        for when, accepted in sorted(self.attempts):
            if not accepted and since is None:
                since = when
            elif accepted and since is not None:
                longest, since = max(longest, when - since), None
        return longest

    def _count(self, phase: str, what: str, error: str = "") -> None:
        with self.lock:
            t = self.tally(phase)
            setattr(t, what, getattr(t, what) + 1)
            if error and len(t.errors) < 20:
                t.errors.append(error)

    def _client(self) -> None:
        while not self.stopping.is_set():
            phase = self.phase
            conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            try:
                conn.connect()
            except (ConnectionRefusedError, ConnectionResetError):  # no request sent: a refusal
                with self.lock:
                    self.attempts.append((time.monotonic(), False))
                self._count(phase, "refused")
                time.sleep(0.05)
                continue
            except OSError as exc:
                self._count(phase, "failed", f"connect: {exc}")
                time.sleep(0.05)
                continue
            with self.lock:
                self.attempts.append((time.monotonic(), True))
            what, error = self._request(conn)
            conn.close()
            self._count(phase, what, error)

    def _request(self, conn: http.client.HTTPConnection) -> tuple[str, str]:
        body = {"model": self.model, "messages": [{"role": "user", "content": "Count slowly."}],
                "stream": True, "max_tokens": self.tokens, "ignore_eos": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        started = False
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                return "failed", f"status {resp.status}: {resp.read()[:200]!r}"
            reason, done = None, False
            for line in resp:
                if not line.startswith(b"data: "):
                    continue
                started = True
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                for choice in json.loads(data).get("choices", []):
                    reason = choice.get("finish_reason") or reason
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return ("cut" if started else "failed"), f"{type(exc).__name__}: {exc}"
        if not done or reason not in ("length", "stop"):
            return "cut", f"finish_reason {reason}, [DONE] {'seen' if done else 'missing'}"
        return "ok", ""

    def summary(self) -> dict[str, object]:
        phases = {p: {k: v for k, v in vars(t).items()} for p, t in self.tallies.items()}
        total = Tally()
        for t in self.tallies.values():
            total.ok, total.cut, total.failed = total.ok + t.ok, total.cut + t.cut, total.failed + t.failed
            total.refused += t.refused
        return {"phases": phases, "ok": total.ok, "cut": total.cut, "failed": total.failed,
                "refused": total.refused, "gap_s": round(self.gap(), 2)}  # fmt: skip


def stop_front(spec_path: str) -> None:
    """Teardown of a fronted demo: both colors' servers, then its HAProxy master (ours: proven by its
    pidfile, exe and config), with SIGTERM."""
    import os
    import signal

    from actions import supervising
    from reconcile.identity import COLORS, color_spec
    from reconcile.ownership.membership import front_master, scope_of
    from reconcile.spec.loader import load_spec

    spec = load_spec(spec_path).spec
    if getattr(spec, "front", None) is None:
        return
    for color in COLORS:
        supervising.stop_marked(scope_of(color_spec(spec, color)), timeout=5.0)
    pid = front_master(spec)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
