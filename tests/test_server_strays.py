"""Strays of a dead server are found by the marker and cleaned before a start; a process without the
marker is reported and never signalled, whatever its name, command line, lock or port."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import server as server_action
from actions.launching import LaunchInputs
from probes import health, server
from reconcile.errors import ActionError
from reconcile.identity import MARKER
from reconcile.plan.records import Change
from tests.test_server_support import (
    FAKE_VLLM,
    Deployment,
    alive,
    cmdline,
    deployment_in,
    foreign_holder,
    free_port,
    lock_is_held,
    start_and_probe,
    wait_for,
)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment_in(tmp_path)


INPUTS = LaunchInputs(packages={"vllm": "0.26.0"})


def test_sigkilled_server_leaves_a_stray_that_the_probe_names_and_a_start_cleans(
    deployment: Deployment,
) -> None:
    d = deployment
    spec, first = start_and_probe(d, INPUTS)
    (engine,) = [p for p in first.processes if p.role == "member"]
    os.kill(first.server.pid, signal.SIGKILL)
    wait_for(lambda: not alive(first.server.pid), 5, "the API server to die")  # type: ignore[union-attr]

    seen = server.probe(spec)
    assert seen.server is None and seen.pidfile.state == "dead"
    (stray,) = seen.strays
    # Found by the dead server's session: its /proc environ (overwritten, as setproctitle does in
    # vLLM's EngineCore) no longer shows the marker nor the identity.
    assert (stray.pid, stray.pgid, stray.sid, stray.identity) == (
        engine.pid,
        first.server.pid,
        first.server.pid,
        None,
    )
    assert "VLLM::EngineCore" in " ".join(stray.cmdline) and stray.name == "VLLM::EngineCor"
    assert lock_is_held(d.hold / "cuda0.lock")  # the "14.8 GiB" the real EngineCore kept
    assert health.probe(spec).state == "not_listening"

    result = server_action.ensure_running(spec, INPUTS)
    assert result.changed and f"stopped 1 process(es) ({engine.pid})" in result.message
    assert not alive(engine.pid)
    after = server.probe(spec)
    assert after.server is not None and not after.strays
    assert health.probe(spec).state == "healthy"


def test_a_stray_outside_the_live_servers_group_is_stopped_and_the_server_kept(
    deployment: Deployment,
) -> None:
    d = deployment
    spec = d.spec()
    server_action.ensure_running(spec, INPUTS)
    live = server.probe(spec).server
    assert live is not None
    # An orphan of an earlier server: our marker, its own group, something holding a port.
    stray = subprocess.Popen(
        [
            "python3",
            "-c",
            "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            "print('ready', flush=True); time.sleep(120)",
        ],
        env={"PATH": os.environ["PATH"], MARKER: d.marker},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    d.procs.append(stray)
    assert stray.stdout is not None and stray.stdout.readline().strip() == b"ready"
    assert [p.pid for p in server.probe(spec).strays] == [stray.pid]
    # The plan's "stop strays" Change is a `-` while the spec still says running = true.
    result = server_action.apply(Change("server", "-", "stop 1 stray", "strays"), spec, INPUTS)
    assert result.changed and "stray" in result.message
    assert stray.wait(5) == -signal.SIGTERM
    kept = server.probe(spec).server
    assert kept is not None and kept.pid == live.pid


def test_a_foreign_vllm_lookalike_on_our_port_is_reported_and_never_signalled(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec()
    foreign = foreign_holder(d, port=d.port)
    assert "vllm serve" in cmdline(foreign.pid)
    seen = server.probe(spec)
    assert seen.processes == ()
    assert (seen.listener.state, seen.listener.pid) == ("foreign", foreign.pid)
    with pytest.raises(ActionError, match=f"port {d.port} is held by pid {foreign.pid}"):
        server_action.ensure_running(spec, INPUTS)
    assert not server_action.ensure_stopped(spec).changed
    # A pidfile naming it (a reused pid) does not make it ours either.
    d.state_dir.mkdir()
    (d.state_dir / f"{d.name}.pid").write_text(f"{foreign.pid}\n")
    assert server.probe(spec).pidfile.state == "foreign"
    assert not server_action.ensure_stopped(spec).changed
    time.sleep(0.2)
    assert foreign.poll() is None and alive(foreign.pid)


def test_a_foreign_process_holding_the_gpu_fails_our_start_and_survives_it(deployment: Deployment) -> None:
    d = deployment
    foreign = foreign_holder(d)  # holds the "GPU" lock, not the port
    spec = d.spec()
    with pytest.raises(server_action.ServerStartError) as caught:
        server_action.ensure_running(spec, INPUTS)
    assert any("Free memory on device cuda:0" in line for line in caught.value.failure.log_tail)
    assert any("held by other processes" in x for x in caught.value.failure.diagnoses)
    assert foreign.poll() is None and lock_is_held(d.hold / "cuda0.lock")


def test_a_marked_process_of_another_deployment_is_not_ours(deployment: Deployment) -> None:
    d = deployment
    other = f"{d.name}-other"
    proc = subprocess.Popen(
        [FAKE_VLLM, "serve", str(d.model_dir), "--port", str(free_port())],
        env={"PATH": os.environ["PATH"], MARKER: other, **d.fake_env(FAKE_VLLM_HOLD=str(d.root / "other"))},
        stdout=subprocess.DEVNULL,
    )
    d.procs.append(proc)
    try:
        time.sleep(0.2)
        assert server.probe(d.spec()).processes == ()
        assert not server_action.ensure_stopped(d.spec()).changed
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(5)
