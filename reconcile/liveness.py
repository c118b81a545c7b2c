"""Liveness beyond /health: is the vLLM engine making progress? vLLM's API server answers /health with
200 while its EngineCore is hung (seen on 0.26.0 with the engine stopped), so that answer alone cannot tell.

Pure apart from the state file: probes.liveness takes an EngineSample (a 1-token keyed completion with a
deadline, and the generated-token counter before and after) and reads the stall kept so far; judge() says
alive, busy, stalled or hung; the server row plans a restart on hung and, in apply, keeps the stall in
`<state_dir>/liveness-<name>.json` (0600 in the 0700 state dir) so the window spans scheduled applies.
"""

from __future__ import annotations

import json
import os
import time

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from reconcile.spec.models import Spec


class Stall(Record):
    """A stall as the state file keeps it: first seen at `since` on the server `pid` (started at
    `start`, its create time: a reused pid is another server), the token counter then at `tokens`."""

    pid: int
    start: float
    since: float
    tokens: float | None
    running: float | None = None
    waiting: float | None = None


class EngineSample(Record):
    """One look at the engine. `answered`: True when the 1-token completion came back with a token,
    False when it got no answer within `deadline`, None when it could not tell (`error` says why:
    refused, an error answer, the key not sent). Tokens and queue from /metrics, when it answered."""

    at: float  # wall clock of the first read
    answered: bool | None
    seconds: float  # how long the completion took (or was waited on)
    deadline: float
    tokens_before: float | None = None
    tokens_after: float | None = None
    running: float | None = None
    waiting: float | None = None
    error: str | None = None
    prior: Stall | None = None  # what the state file held


class Verdict(Record):
    state: Literal["alive", "busy", "stalled", "hung", "unknown"]
    stall: Stall | None  # what the state file must hold after this look
    message: str

    @property
    def hung(self) -> bool:
        return self.state == "hung"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _queue(running: float | None, waiting: float | None) -> str:
    if running is None and waiting is None:
        return "vLLM's /metrics unread"
    return f"{running or 0:g} running, {waiting or 0:g} waiting by vLLM's /metrics"


def judge(sample: EngineSample, pid: int, start: float, window: float) -> Verdict:
    """The engine is hung when it has made no progress (no answer to the tiny completion, no generated
    token) for `window` seconds, counted from the first look that saw it stalled; a stall kept for
    another server, or at another token count, starts again now. Busy (tokens move while the tiny
    completion waits in the queue) is progress."""
    prior = sample.prior
    same = prior is not None and prior.pid == pid and abs(prior.start - start) < 1.0
    if sample.answered is True:
        return Verdict("alive", None, f"a 1-token completion answered in {sample.seconds:.1f}s")
    if sample.answered is None:
        return Verdict("unknown", prior if same else None, f"progress unknown: {sample.error or '?'}")
    before, after = sample.tokens_before, sample.tokens_after
    if before is not None and after is not None and after > before:
        return Verdict(
            "busy",
            None,
            f"busy: {after - before:g} tokens generated while a 1-token completion waited "
            f"{sample.seconds:.0f}s ({_queue(sample.running, sample.waiting)})",
        )
    since = sample.at
    if same and prior is not None and (after is None or prior.tokens is None or prior.tokens == after):
        since = min(prior.since, sample.at)
    now = sample.at + sample.seconds
    stalled = max(0.0, now - since)
    stall = Stall(pid, start, since, after, sample.running, sample.waiting)
    what = (
        f"no tokens for {stalled:.0f}s with {_queue(sample.running, sample.waiting)}; "
        f"a 1-token completion got no answer in {sample.deadline:g}s; /health still answers"
    )
    if stalled >= window:
        return Verdict("hung", stall, f"engine hung since {_clock(since)} ({what})")
    return Verdict(
        "stalled",
        stall,
        f"engine stalled since {_clock(since)} ({what}); restarted once stalled for {window:g}s",
    )


def state_path(spec: Spec) -> str:
    """<state_dir>/liveness-<name>.json."""
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return f"{spec.machine.state_dir.rstrip('/')}/liveness-{spec.server.name}.json"


def read_stall(spec: Spec) -> Stall | None:
    """The stall kept by the last apply; None when there is none (or it was damaged: moved aside)."""
    from reconcile.safety import statefiles

    data = statefiles.read_liveness(state_path(spec))
    stall = data.get("stall") if data else None
    if not isinstance(stall, dict):
        return None
    return Stall(
        int(stall["pid"]),
        float(stall["start"]),
        float(stall["since"]),
        stall.get("tokens"),
        stall.get("running"),
        stall.get("waiting"),
    )


def keep_stall(spec: Spec, stall: Stall | None, prior: Stall | None) -> bool:
    """Write the stall (None: none) when it differs from what the file holds; True when written. Called
    by apply under its lock, never by plan."""
    if stall == prior:
        return False
    path = state_path(spec)
    from reconcile.host import atomic_write
    from reconcile.safety import statefiles
    from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir

    ensure_dir(os.path.dirname(path), PRIVATE_DIR)
    statefiles.clear_non_file(path)  # rename() cannot replace a directory
    doc = {"format": statefiles.LIVENESS_FORMAT, "stall": None if stall is None else stall._asdict()}
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=PRIVATE_FILE)
    return True
