"""Where one run's time goes: each phase's wall seconds in the order the phases ran (the CLI's start,
the spec's loading, the lock, the plans, the Changes, the acceptance check, the record), so that a
slow apply or rollback explains itself on any machine. The commands, reconcile.apply.changes and
reconcile.apply.switching mark where a phase ends (`lap`); the apply journal, last-run.json and the
apply report keep `taken()`. One run a process: a phase that runs twice (an automatic rollback's
second switch) adds up.
"""

from __future__ import annotations

import os
import time

_laps: dict[str, float] = {}
_since: list[float] = []  # where the last lap ended (monotonic); empty: none yet, the process's start


def _process_start() -> float:
    """When this process started, on the monotonic clock (/proc's start time, in clock ticks since
    boot); now, when that cannot be read: the first phase then counts from here."""
    now = time.monotonic()
    from reconcile.ownership.membership import read_stat

    try:
        found = read_stat(os.getpid())
        if found is None:
            return now
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - found.start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return now
    return now - min(max(0.0, age), 3600.0)


def begin() -> None:
    """A command's run starts: its phases from none. The first in this process counts its start (the
    interpreter, reconcile's imports, the arguments) as the phase `start`; a later one (several runs in
    one process: tests) starts from now."""
    first = not _since
    _laps.clear()
    if first:
        lap("start")
    else:
        _since[:] = [time.monotonic()]


def lap(name: str) -> None:
    """The phase `name` ends now: the time since the last lap (the process's start, for the first) is its."""
    now = time.monotonic()
    last = _since[0] if _since else _process_start()
    _laps[name] = _laps.get(name, 0.0) + max(0.0, now - last)
    _since[:] = [now]


def taken() -> dict[str, float]:
    """Each phase so far and its seconds, in the order they first ran."""
    return {name: round(seconds, 3) for name, seconds in _laps.items()}


def describe(phases: dict[str, float]) -> str:
    """`start 0.2s · load 0.1s · plan 0.4s ...`: the phases as the apply report prints them."""
    return " · ".join(f"{name} {seconds:.2f}s" for name, seconds in phases.items())
