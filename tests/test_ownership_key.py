"""Issue 12's key and impostor attacks, for real: a listener of another user on the spec's port that
records what it receives, and an impostor carrying the marker and the launch digest.

Each runs on both ownership paths (the server's own cgroup, and the start-time fallback).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import server as server_action
from actions.launching import launch_command
from probes import health, server
from reconcile.errors import ActionError
from reconcile.identity import IDENTITY, MARKER
from tests.ownership_support import (
    INPUTS,
    PATHS,
    SPY,
    as_nobody,
    deployment_on,
    received,
    root_only,
)
from tests.test_server_support import Deployment


@pytest.fixture(params=PATHS)
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    yield from deployment_on(request.param, tmp_path, monkeypatch)


# --- 2. the key goes to whoever listens on the port ---------------------------------------------


@root_only
def test_the_key_never_reaches_a_foreign_listener_on_the_port(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec = d.spec()
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(d.port)], {}, strangers)
    seen = health.probe(spec)
    check = health.chat_check(spec, timeout=5)
    listener = server.probe(spec).listener
    got = received(spy)
    assert d.key not in got and "authorization" not in got.lower()
    assert "GET /health" in got  # it was asked the unkeyed question, so the probe did run
    assert not check.ok
    for text in (seen.error or "", check.steps[0].message):
        assert f"pid {spy.pid}" in text and "nobody" in text and "python3" in text
    assert (listener.state, listener.pid, listener.user) == ("foreign", spy.pid, "nobody")
    assert listener.cmdline and "python3" in listener.cmdline[0]


# --- 3. an impostor with the marker and the digest ----------------------------------------------


@root_only
def test_an_impostor_on_the_port_with_marker_and_digest_is_never_adopted(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec = d.spec()
    digest = launch_command(spec, INPUTS).identity.digest
    impostor = as_nobody(
        ["/usr/bin/python3", "-c", SPY, str(d.port)], {MARKER: d.marker, IDENTITY: digest}, strangers
    )
    seen = server.probe(spec)
    assert seen.server is None and seen.processes == ()
    assert seen.listener.state == "foreign" and seen.listener.pid == impostor.pid
    with pytest.raises(ActionError, match=f"port {d.port} is held by pid {impostor.pid}.*nobody"):
        server_action.ensure_running(spec, INPUTS)
    assert not (d.state_dir / f"{d.name}.pid").exists()
    assert impostor.poll() is None  # never signalled
    assert d.key not in received(impostor)


@root_only
def test_an_impostor_off_the_port_is_neither_adopted_nor_signalled(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec = d.spec(startup_timeout=3)
    digest = launch_command(spec, INPUTS).identity.digest
    code = "import time; print('ready', flush=True); time.sleep(120)"
    impostor = as_nobody(["/usr/bin/python3", "-c", code], {MARKER: d.marker, IDENTITY: digest}, strangers)
    result = server_action.ensure_running(spec, INPUTS)
    assert "started" in result.message and str(impostor.pid) not in result.message
    seen = server.probe(spec)
    assert seen.server is not None and seen.server.pid != impostor.pid
    assert impostor.pid not in {p.pid for p in seen.processes}
    assert impostor.poll() is None


@root_only
def test_a_read_only_plan_sends_no_key_to_a_listener_of_another_user(
    tmp_path: Path, strangers: list[int]
) -> None:
    """Attack 2 as the issue ran it: the server down, `reconcile plan` on the command line."""
    from tests.apply_support import demo_in

    for demo in demo_in(tmp_path):
        demo.key_file.parent.mkdir(parents=True, exist_ok=True)
        demo.key_file.write_text("sk-the-real-key\n")
        demo.key_file.chmod(0o600)
        spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(demo.port)], {}, strangers)
        run = demo.cli("plan")
        status = demo.cli("status")
        got = received(spy)
        assert "sk-the-real-key" not in got and "authorization" not in got.lower()
        assert run.returncode == 1, run.output  # host.port: the port is held
        shown = f"port {demo.port} is held by `/usr/bin/python3 -c"
        assert shown in run.output and "of user nobody (pid " in run.output, run.output
        assert f"pid {spy.pid}" in run.output
        assert "ownership:" in status.output, status.output
        assert f"what answers on the port is not ours: pid {spy.pid} (user nobody" in status.output
        (held,) = [line for line in run.output.splitlines() if "is held by" in line]
        assert held.endswith("[host.port]")  # one line, though the spy's command line has newlines
