"""Which processes belong to a deployment: the marker, our live session when setproctitle hid it, or
a recorded (pid, start time, boot id) once the session's leader is gone.

Real processes and sessions; the rule in reconcile.ownership.membership is what stop_marked signals by.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.identity import MARKER
from reconcile.ownership.membership import (
    ProcId,
    Scope,
    deployment_members,
    is_member,
    proc_id,
    proc_ids,
    snapshot,
)

NAME = f"membership-{os.getpid()}@/tmp/state"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _session(env: dict[str, str], procs: list[subprocess.Popen[bytes]]) -> tuple[int, int]:
    """A session leader (a shell) with one child whose environment holds no PATH, like a process whose
    environ block setproctitle overwrote."""
    leader = subprocess.Popen(
        ["/bin/sh", "-c", "env -i /bin/sleep 60 & wait"], env=env, start_new_session=True
    )
    procs.append(leader)
    for _ in range(100):
        if kids := _children(leader.pid):
            return leader.pid, kids[0]
        time.sleep(0.02)
    raise AssertionError("no child")


def test_a_hidden_child_of_our_session_is_ours_even_after_the_leader_dies(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    leader, child = _session({"PATH": os.environ["PATH"], MARKER: NAME}, procs)
    assert set(deployment_members(NAME)) == {leader, child}
    seen = Scope(NAME, members=proc_ids(snapshot(deployment_members(NAME))))  # what a healthy start records
    os.kill(leader, signal.SIGKILL)
    procs[0].wait()  # reaped: the session id now names no process
    assert set(deployment_members(seen)) == {child}
    assert is_member(child, seen)
    assert not is_member(child, NAME)  # without the record nothing ties it to us
    assert not is_member(child, Scope(NAME, launches=(ProcId(leader, 0, "x"),)))  # nor a bare session id


def test_someone_elses_session_under_a_recorded_id_is_never_ours(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    # The pid we recorded is now the leader of a session we did not start (pid reuse).
    leader, child = _session({"PATH": os.environ["PATH"]}, procs)
    now = proc_id(leader)
    assert now is not None
    stale = Scope(NAME, launches=(ProcId(leader, now.start - 1, now.boot),))  # our launch, long gone
    assert deployment_members(stale) == {}
    assert not is_member(child, stale)
    assert not is_member(leader, stale)


def test_a_process_of_our_session_with_a_normal_environment_but_no_marker_is_not_ours(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    leader = subprocess.Popen(
        ["/bin/sh", "-c", "env -u " + MARKER + " /bin/sleep 60 & wait"],
        env={"PATH": os.environ["PATH"], MARKER: NAME},
        start_new_session=True,
    )
    procs.append(leader)
    time.sleep(0.2)
    (child,) = _children(leader.pid)
    assert set(deployment_members(NAME)) == {leader.pid}
    launched = proc_id(leader.pid)
    assert launched is not None
    assert not is_member(child, Scope(NAME, launches=(launched,)))


def test_the_real_setproctitle_hides_the_marker_and_the_session_still_finds_the_process(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """vLLM's children call setproctitle; this is the library itself, not an imitation."""
    pytest.importorskip("setproctitle")
    import sys

    code = (
        "import setproctitle, subprocess, sys; "
        "child = subprocess.Popen([sys.executable, '-c', "
        "\"import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(60)\"]); "
        "child.wait()"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, MARKER: NAME}, start_new_session=True
    )
    procs.append(leader)
    for _ in range(200):
        kids = _children(leader.pid)
        if kids and Path(f"/proc/{kids[0]}/comm").read_text().strip() == "VLLM::EngineCor":
            break  # the title is set: the environ block is overwritten by now
        time.sleep(0.02)
    (engine,) = kids
    with open(f"/proc/{engine}/environ", "rb") as f:
        assert MARKER.encode() not in f.read()  # what the marker alone cannot see
    assert set(deployment_members(NAME)) == {leader.pid, engine}  # the live leader's session
    seen = Scope(NAME, members=proc_ids(snapshot(deployment_members(NAME))))
    os.kill(leader.pid, signal.SIGKILL)
    procs[0].wait()
    assert set(deployment_members(seen)) == {engine}
    assert is_member(engine, seen)
