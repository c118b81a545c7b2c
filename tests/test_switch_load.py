"""A switch under load, end to end through `reconcile apply` and `reconcile rollback` on the demo:
8 streams run the whole time; the old server drains (--shutdown-timeout), so no request in flight is
cut; new connections during the gap are refused and counted."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import tomlkit

from actions.supervising import marked_pids
from reconcile.apply import generations
from reconcile.identity import COLORS, color_spec
from reconcile.ownership.membership import front_master, scope_of
from reconcile.spec.loader import load_spec
from tests.apply_support import Demo
from tests.switch_load_support import Load, stop_front
from tests.test_fake_vllm_stop import refused
from tests.test_server_support import free_port, wait_for


def _spec(demo: Demo, seqs: int, front: list[int] | None = None) -> None:
    demo.write_spec(lambda doc: _spec_edit(doc, seqs, front))


def _spec_edit(doc: Any, seqs: int, front: list[int] | None = None) -> None:
    doc["server"]["args"]["max-num-seqs"] = seqs
    doc["server"]["env"]["FAKE_VLLM_TOKEN_S"] = "0.02"  # 150 tokens: 3 s per stream
    doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = "1.0"
    if front is not None:
        # Two colors share the fake's GPU as vLLMs do: 0.4 + 0.4 of it fit, as on a GPU with room.
        doc["server"]["args"]["gpu-memory-utilization"] = 0.4
        doc["front"] = tomlkit.table()
        doc["front"]["ports"] = front


def test_a_drain_restart_under_load_cuts_no_request_and_counts_the_refused(demo: Demo) -> None:
    _spec(demo, 8)
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    key = demo.key_file.read_text().strip()
    with Load(demo.port, key, demo.name) as load:
        wait_for(lambda: load.tally("before").ok >= 8, 30, "8 whole requests before the switch")
        load.phase = "switch"
        _spec(demo, 9)
        switched = demo.cli("apply")
        assert switched.returncode == 2, switched.output
        load.phase = "after switch"
        wait_for(lambda: load.tally("after switch").ok >= 8, 30, "requests served by the new server")
        load.phase = "rollback"
        back = demo.cli("rollback")
        assert back.returncode in (0, 2), back.output
        load.phase = "after rollback"
        wait_for(lambda: load.tally("after rollback").ok >= 8, 30, "requests served after the rollback")
    s = load.summary()
    assert s["cut"] == 0 and s["failed"] == 0, s  # unanswered (reset in the closing listener's queue) may be
    assert load.tally("switch").refused > 0 and load.tally("rollback").refused > 0, s  # counted, not hidden
    assert load.tally("switch").ok > 0  # the streams in flight at the stop finished whole
    assert "it drains in-flight requests first (up to 20s)" in switched.output
    assert "prepared in" in switched.output and "down for" in switched.output


def _stopped(doc: Any, ports: list[int]) -> None:
    doc["server"]["running"] = False
    doc["server"]["args"]["gpu-memory-utilization"] = 0.4
    doc["front"] = tomlkit.table()
    doc["front"]["ports"] = ports


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run installs it)")
def test_a_blue_green_switch_and_rollback_under_load_fail_no_request(demo: Demo) -> None:
    ports = [free_port(), free_port()]
    _spec(demo, 8, ports)
    try:
        first = demo.cli("apply")
        assert first.returncode == 2, first.output
        assert "started haproxy" in first.output
        key = demo.key_file.read_text().strip()
        with Load(demo.port, key, demo.name) as load:  # through HAProxy on the public port
            wait_for(lambda: load.tally("before").ok >= 8, 30, "8 whole requests before the switch")
            load.phase = "switch"
            _spec(demo, 9, ports)
            plan = demo.cli("plan")
            assert "switch: drain-restart -> blue/green" in plan.output, plan.output
            switched = demo.cli("apply")
            assert switched.returncode == 2, switched.output
            load.phase = "after switch"
            wait_for(lambda: load.tally("after switch").ok >= 8, 30, "requests served by green")
            load.phase = "rollback"
            back = demo.cli("rollback")
            assert back.returncode in (0, 2), back.output
            load.phase = "after rollback"
            wait_for(lambda: load.tally("after rollback").ok >= 8, 30, "requests served after the rollback")
        s = load.summary()
        zero = s["failed"] == 0 and s["cut"] == 0 and s["refused"] == 0 and s["unanswered"] == 0
        assert zero, s  # zero downtime
        assert "traffic moved to green" in switched.output and "down for 0.0s" in switched.output
        assert "traffic moved to blue" in back.output, back.output
        master = front_master(load_spec(str(demo.spec_path)).spec)
        assert master is not None
        demo.write_spec(lambda doc: _stopped(doc, ports))
        stopped = demo.cli("apply")
        assert stopped.returncode == 2 and f"stopped haproxy (master pid {master})" in stopped.output, (
            stopped.output
        )
        spec = load_spec(str(demo.spec_path)).spec
        assert refused(demo.port)
        assert not any(marked_pids(scope_of(color_spec(spec, c))) for c in COLORS)
    finally:
        stop_front(str(demo.spec_path))


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run installs it)")
def test_a_blue_green_switch_that_fails_acceptance_never_takes_the_old_one_away(demo: Demo) -> None:
    ports = [free_port(), free_port()]
    _spec(demo, 8, ports)
    try:
        assert demo.cli("apply").returncode == 2
        key = demo.key_file.read_text().strip()
        with Load(demo.port, key, demo.name) as load:
            wait_for(lambda: load.tally("before").ok >= 8, 30, "8 whole requests before the switch")
            load.phase = "switch"

            def broken(doc: Any) -> None:
                _spec_edit(doc, 9, ports)
                doc["server"]["env"]["FAKE_VLLM_CHAT_FAIL"] = "1"  # healthy, but every chat fails

            demo.write_spec(broken)
            failed = demo.cli("apply")
            load.phase = "after"
            wait_for(lambda: load.tally("after").ok >= 8, 30, "requests still served by blue")
        assert failed.returncode == 4, failed.output
        assert "green failed its acceptance check" in failed.output and "blue still serves" in failed.output
        s = load.summary()
        assert s["failed"] == 0 and s["cut"] == 0 and s["refused"] == 0, s
        spec = load_spec(str(demo.spec_path)).spec
        assert not marked_pids(scope_of(color_spec(spec, "green")))  # the failed color was stopped
    finally:
        stop_front(str(demo.spec_path))


def _plain(doc: Any, seqs: int, *, running: bool = True) -> None:
    """Front-less, at the utilization the fronted specs use: its launch inputs are theirs."""
    _spec_edit(doc, seqs)
    doc["server"]["args"]["gpu-memory-utilization"] = 0.4
    doc["server"]["running"] = running


def _profile_generations(demo: Demo) -> list[int]:
    """The generation numbers recorded (reconcile history's), oldest first."""
    return [int(g["generation"]) for g in generations.read_all(str(demo.state_dir))]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run installs it)")
def test_a_rollback_after_front_less_generations_goes_to_the_fronted_one_below(demo: Demo) -> None:
    """As on the H200 lab: front-less generations a, b (and a rollback, a stop), then a fronted a -> b
    with the same launch inputs; `rollback` must return to the fronted a (blue, through the front),
    not to the front-less a, whose server wants the port HAProxy holds."""
    ports = [free_port(), free_port()]
    try:
        for seqs in (8, 9):
            demo.write_spec(lambda doc, s=seqs: _plain(doc, s))
            assert demo.cli("apply").returncode == 2
        assert demo.cli("rollback").returncode in (0, 2)
        demo.write_spec(lambda doc: _plain(doc, 9, running=False))
        assert demo.cli("apply").returncode == 2
        front_less = set(_profile_generations(demo))
        _spec(demo, 8, ports)
        first = demo.cli("apply")
        assert first.returncode == 2 and "started haproxy" in first.output, first.output
        fronted_a = generations.current(str(demo.state_dir))
        assert fronted_a not in front_less  # the front is part of what serves: its own generation
        key = demo.key_file.read_text().strip()
        with Load(demo.port, key, demo.name) as load:
            wait_for(lambda: load.tally("before").ok >= 8, 30, "8 whole requests before the switch")
            load.phase = "switch"
            _spec(demo, 9, ports)
            switched = demo.cli("apply")
            assert switched.returncode == 2 and "traffic moved to green" in switched.output, switched.output
            load.phase = "after switch"
            wait_for(lambda: load.tally("after switch").ok >= 8, 30, "requests served by green")
            fronted_b = generations.current(str(demo.state_dir))
            assert fronted_b not in front_less | {fronted_a}
            history = demo.cli("history").output
            assert f"*{fronted_b:>3}" in history, history  # green's server carries generation b's
            load.phase = "rollback"
            back = demo.cli("rollback")
            assert back.returncode in (0, 2), back.output
            assert f"generation {fronted_a}" in back.output and "traffic moved to blue" in back.output, (
                back.output
            )
            load.phase = "after rollback"
            wait_for(lambda: load.tally("after rollback").ok >= 8, 30, "requests served after the rollback")
        s = load.summary()
        zero = s["failed"] == 0 and s["cut"] == 0 and s["refused"] == 0 and s["unanswered"] == 0
        assert zero, s
        history = demo.cli("history").output
        assert f"*{fronted_a:>3}" in history, history  # blue's server carries generation a's
        assert "front: none -> HAProxy, colors on" in history, history
        assert history.count("*") == 1, history
    finally:
        stop_front(str(demo.spec_path))
        from tests.apply_support import stop_servers

        stop_servers(demo)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run installs it)")
def test_an_automatic_rollback_after_front_less_generations_returns_to_the_fronted_one(demo: Demo) -> None:
    """A fronted switch that fails acceptance after front-less generations with the same launch
    inputs: the automatic rollback returns to the fronted generation that served (blue), never to a
    front-less one whose server wants the port HAProxy holds."""
    ports = [free_port(), free_port()]
    try:
        for seqs in (8, 9):
            demo.write_spec(lambda doc, s=seqs: _plain(doc, s))
            assert demo.cli("apply").returncode == 2
        demo.write_spec(lambda doc: _plain(doc, 9, running=False))
        assert demo.cli("apply").returncode == 2
        _spec(demo, 8, ports)
        assert demo.cli("apply").returncode == 2
        fronted = generations.current(str(demo.state_dir))

        def broken(doc: Any) -> None:
            _spec_edit(doc, 9, ports)
            doc["server"]["env"]["FAKE_VLLM_CHAT_FAIL"] = "1"  # healthy, but every chat fails

        demo.write_spec(broken)
        failed = demo.cli("apply")
        assert failed.returncode == 4, failed.output
        assert f"automatic rollback to generation {fronted}:" in failed.output, failed.output
        assert "it serves again" in failed.output, failed.output
        assert generations.current(str(demo.state_dir)) == fronted
        history = demo.cli("history").output
        assert f"*{fronted:>3}" in history and history.count("*") == 1, history
    finally:
        stop_front(str(demo.spec_path))
        from tests.apply_support import stop_servers

        stop_servers(demo)
