"""The apply lock with real processes: two applies at once run one after the other and no action runs
twice; a short --lock-timeout exits 1 naming the holder; a lock left by a SIGKILLed apply is taken over
and reported."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from tests.apply_support import Demo


def holder_pid(demo: Demo, timeout: float = 20.0) -> int:
    """The pid recorded in apply.lock once an apply holds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads(demo.lock_file.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    raise AssertionError("no apply took the lock")


def test_two_applies_started_together_run_one_after_the_other_and_no_action_runs_twice(demo: Demo) -> None:
    a = demo.start("apply", "--lock-timeout", "120")
    b = demo.start("apply", "--lock-timeout", "120")
    first = holder_pid(demo)
    assert first in (a.pid, b.pid)
    runs = {a.pid: demo.finish(a), b.pid: demo.finish(b)}
    second = b.pid if first == a.pid else a.pid

    assert runs[first].returncode == 2, runs[first].output
    assert runs[second].returncode == 0, runs[second].output  # it found nothing left to do
    assert f"waiting up to 120s for the apply lock, held by pid {first} " in runs[second].stderr
    assert "No changes" in runs[second].stdout
    # Each action ran once: one generation, the venv created once, the server started once.
    generations = demo.generations()
    assert len(generations) == 1
    done = [(c["resource"], c["result"]) for g in generations for c in g["changes"]]
    assert done == [
        (r, "changed") for r in ("venv", "venv.packages", "model.files", "model.config", "api_key", "server")
    ]
    assert demo.starts_in_log() == 1
    assert len(demo.server_pids()) == 2  # the server and its engine: one deployment
    assert demo.lock_file.read_bytes() == b""


def test_an_apply_with_a_short_lock_timeout_exits_1_naming_the_holder(seeded: Demo) -> None:
    def slow_start(doc: Any) -> None:
        doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = "4"  # holds the lock while /health waits

    seeded.write_spec(slow_start)
    long = seeded.start("apply")
    holder = holder_pid(seeded)
    assert holder == long.pid
    started = time.monotonic()
    short = seeded.cli("apply", "--lock-timeout", "0.5")
    waited = time.monotonic() - started
    assert short.returncode == 1, short.output
    assert f"another apply holds the lock: pid {holder} since " in short.stderr
    assert "waited 0.5s" in short.stderr and waited < 3.5
    assert seeded.finish(long).returncode == 2
    assert len(seeded.generations()) == 1 and seeded.starts_in_log() == 1


def test_a_lock_left_by_a_sigkilled_apply_is_taken_over_and_reported(seeded: Demo) -> None:
    killed = seeded.cli("apply", kill_at="apply.locked")
    assert killed.returncode == -signal.SIGKILL
    left = json.loads(seeded.lock_file.read_text())  # a clean release empties it; a kill cannot
    assert left["pid"] > 0 and "apply" in left["command"]

    run = seeded.cli("apply")
    assert run.returncode == 2, run.output
    assert f"note: took over the lock left by pid {left['pid']} since " in run.stdout
    assert seeded.lock_file.read_bytes() == b""
    again = seeded.cli("apply")
    assert again.returncode == 0 and "took over" not in again.output
