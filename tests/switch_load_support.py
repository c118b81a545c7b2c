"""A load of streamed chats through a switch, as the reference's 8 concurrent streams: each client
opens a new connection per request and retries one that got no answer after 50 ms.

Each request is counted once, per phase (the phase named when it was sent):
- ok: finished whole (finish_reason length/stop and [DONE]);
- cut: its answer had started (a status line came back) and then broke off or ended early
  (finish_reason abort, no [DONE]): an in-flight request the switch cut;
- refused: its connection was refused (ECONNREFUSED, or reset during the handshake): not served;
- unanswered: connected and sent, then reset or closed before any byte of an answer came back.
  This is what a listener that closes with connections in its accept queue does (the kernel resets
  them; uvicorn, vLLM 0.26's server, also closes open connections with no request read yet). Not
  served, like a refusal: it is counted as unanswered while a switch is under way, and as failed in
  the steady phases ("before", "after ..."), where nothing should close the listener;
- failed: an error status, a timeout, anything else.
refused + unanswered is what the gap did not serve; `gap()` is the longest run from an attempt not
served to the next served one (an answer started). Used by tests/test_switch_load.py,
tests/test_gpu_lab_switch.py and benchmarks/bench_switch_load.py."""

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
    unanswered: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def unserved(self) -> int:
        """Requests the gap did not serve: refused, or reset before any answer."""
        return self.refused + self.unanswered


UNANSWERED = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


def steady(phase: str) -> bool:
    """A phase with no switch under way: nothing there should close the listener."""
    return phase == "before" or phase.startswith("after")


def send(conn: http.client.HTTPConnection, key: str, model: str, tokens: int) -> None:
    """A streamed chat of `tokens` tokens (ignore_eos), keyed."""
    body = {"model": model, "messages": [{"role": "user", "content": "Count slowly."}],
            "stream": True, "max_tokens": tokens, "ignore_eos": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)


def outcome(conn: http.client.HTTPConnection, sent: BaseException | None = None) -> tuple[str, str]:
    """("ok" | "cut" | "unanswered" | "failed", error) of the request sent on `conn` (`sent`: what
    sending it raised). Unanswered: reset or closed before the status line's first byte."""
    if sent is not None:
        what = "unanswered" if isinstance(sent, UNANSWERED) else "failed"
        return what, f"send: {type(sent).__name__}: {sent}"
    try:
        resp = conn.getresponse()
    except UNANSWERED as exc:
        return "unanswered", f"{type(exc).__name__}: {exc}"
    except (OSError, http.client.HTTPException) as exc:
        return "failed", f"{type(exc).__name__}: {exc}"
    try:
        if resp.status != 200:
            return "failed", f"status {resp.status}: {resp.read()[:200]!r}"
        reason, done = None, False
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                continue
            for choice in json.loads(data).get("choices", []):
                reason = choice.get("finish_reason") or reason
    except (OSError, http.client.HTTPException, ValueError) as exc:  # the answer had started
        return "cut", f"{type(exc).__name__}: {exc}"
    if not done or reason not in ("length", "stop"):
        return "cut", f"finish_reason {reason}, [DONE] {'seen' if done else 'missing'}"
    return "ok", ""


class Load:
    def __init__(
        self, port: int, key: str, model: str, *, clients: int = 8, tokens: int = 150, host: str = "127.0.0.1"
    ) -> None:
        self.port, self.key, self.model, self.tokens, self.host = port, key, model, tokens, host
        self.phase = "before"
        self.tallies: dict[str, Tally] = {}
        self.attempts: list[tuple[float, bool]] = []  # (when, served) of every attempt
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
        """The longest time from an attempt not served (refused, or no answer) to the next served one
        (its answer started); 0: every attempt was served."""
        longest, since = 0.0, None
        for when, served in sorted(self.attempts):
            if not served and since is None:
                since = when
            elif served and since is not None:
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
            when = time.monotonic()
            try:
                conn.connect()
            except (ConnectionRefusedError, ConnectionResetError):  # no request sent: a refusal
                self._attempt(when, False)
                self._count(phase, "refused")
                time.sleep(0.05)
                continue
            except OSError as exc:
                self._attempt(when, False)
                self._count(phase, "failed", f"connect: {exc}")
                time.sleep(0.05)
                continue
            sent: BaseException | None = None
            try:
                send(conn, self.key, self.model, self.tokens)
            except (OSError, http.client.HTTPException) as exc:
                sent = exc
            what, error = outcome(conn, sent)
            conn.close()
            if what == "unanswered" and steady(phase):
                what = "failed"
            self._attempt(when, what in ("ok", "cut") or error.startswith("status "))  # an answer started
            self._count(phase, what, error)
            if what == "unanswered":
                time.sleep(0.05)

    def _attempt(self, when: float, served: bool) -> None:
        with self.lock:
            self.attempts.append((when, served))

    def summary(self) -> dict[str, object]:
        phases = {p: {k: v for k, v in vars(t).items()} for p, t in self.tallies.items()}
        total = Tally()
        for t in self.tallies.values():
            total.ok, total.cut, total.failed = total.ok + t.ok, total.cut + t.cut, total.failed + t.failed
            total.refused, total.unanswered = total.refused + t.refused, total.unanswered + t.unanswered
        return {"phases": phases, "ok": total.ok, "cut": total.cut, "failed": total.failed,
                "refused": total.refused, "unanswered": total.unanswered, "unserved": total.unserved,
                "gap_s": round(self.gap(), 2)}  # fmt: skip


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
