"""Issue 12's pid attacks, for real: a recorded pid that comes round again (ns_last_pid), a stale or
corrupt pidfile, a marked process of another user; records' modes; which ownership path is in use.

Each runs on both ownership paths (the server's own cgroup, and the start-time fallback).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import server as server_action
from probes import server
from reconcile.identity import MARKER
from tests.ownership_support import (
    INPUTS,
    PATHS,
    as_nobody,
    daemon_session,
    deployment_on,
    kernel_thread,
    kill_tree,
    root_only,
)
from tests.test_server_support import Deployment, alive, start_and_probe


@pytest.fixture(params=PATHS)
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    yield from deployment_on(request.param, tmp_path, monkeypatch)


# --- 1. a reused pid, a stale pidfile, a corrupt pidfile ----------------------------------------


@root_only
def test_a_recorded_pid_that_comes_round_again_is_a_stranger(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec, first = start_and_probe(d, INPUTS)
    recorded = first.server.pid
    kill_tree(first)
    # Another program's session now has the id our launch record (and the pidfile) names.
    sid, daemon = daemon_session(strangers, pid=recorded)
    assert sid == recorded
    seen = server.probe(spec)
    assert seen.processes == () and seen.strays == ()
    assert seen.pidfile.state != "ours"
    assert not server_action.ensure_stopped(spec).changed
    assert alive(daemon)


def test_a_stale_pidfile_naming_someone_elses_session_takes_nothing(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    sid, daemon = daemon_session(strangers)
    d.state_dir.mkdir(mode=0o700)
    (d.state_dir / f"{d.name}.pid").write_text(f"{sid}\n")
    seen = server.probe(d.spec())
    assert seen.processes == () and seen.pidfile.state == "dead"
    assert not server_action.ensure_stopped(d.spec()).changed
    assert alive(daemon)


@pytest.mark.parametrize("content", ["0", "1", "kthread", "-5", "binary"])
def test_a_corrupt_pidfile_is_said_in_one_line_and_lists_no_strays(
    deployment: Deployment, content: str
) -> None:
    d = deployment
    spec = d.spec()
    d.state_dir.mkdir(mode=0o700)
    pidfile = d.state_dir / f"{d.name}.pid"
    raw = {"kthread": f"{kernel_thread()}\n".encode(), "binary": b"\xff\xfe\x00\x9c garbage\n"}.get(
        content, f"{content}\n".encode()
    )
    pidfile.write_bytes(raw)
    seen = server.probe(spec)
    assert seen.processes == () and seen.strays == ()
    assert seen.pidfile.state == "corrupt"
    assert seen.pidfile.reason and "\n" not in seen.pidfile.reason
    # apply is not wedged by it: it starts the server and keeps the bad file aside
    result = server_action.ensure_running(spec, INPUTS)
    assert result.changed and "started" in result.message
    after = server.probe(spec)
    assert after.server is not None and after.pidfile.state == "ours"
    aside = list(d.state_dir.glob(f"{d.name}.pid.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == raw


def test_a_binary_pidfile_beside_a_running_server_is_replaced_not_a_crash(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec()
    server_action.ensure_running(spec, INPUTS)
    pidfile = d.state_dir / f"{d.name}.pid"
    pidfile.write_bytes(b"\xff\xfe\x00\x9c")
    result = server_action.ensure_running(spec, INPUTS)  # was "UnicodeDecodeError (a bug)"
    assert "pidfile and record rewritten" in result.message
    assert server.probe(spec).pidfile.state == "ours"


def test_records_of_identities_and_launches_are_0600_in_a_0700_dir(deployment: Deployment) -> None:
    d = deployment
    old = os.umask(0)
    try:
        server_action.ensure_running(d.spec(), INPUTS)
    finally:
        os.umask(old)
    assert d.state_dir.stat().st_mode & 0o777 == 0o700
    for name in (f"server-{d.name}.json", f"{d.name}.pid"):
        assert (d.state_dir / name).stat().st_mode & 0o777 == 0o600, name


def test_a_marked_process_of_another_user_is_never_a_member(
    deployment: Deployment, strangers: list[int]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    d = deployment
    code = "import time; print('ready', flush=True); time.sleep(120)"
    other = as_nobody(["/usr/bin/python3", "-c", code], {MARKER: d.marker}, strangers)
    assert server.probe(d.spec()).processes == ()
    assert not server_action.ensure_stopped(d.spec()).changed
    assert other.poll() is None


def test_status_says_which_ownership_path_is_in_use_and_why(
    deployment: Deployment, request: pytest.FixtureRequest
) -> None:
    import io

    from reconcile.commands.status import StatusReport, render_status
    from reconcile.ownership.cgroups import cgroup_name, cgroup_procs

    spec = deployment.spec()
    server_action.ensure_running(spec, INPUTS)
    seen = server.probe(spec)
    assert seen.server is not None
    owned = seen.ownership
    if request.node.callspec.params["deployment"] == "cgroup":
        assert (
            owned.path == "cgroup" and owned.where and owned.where.endswith("/reconcile/" + cgroup_name(spec))
        )
        assert {p.pid for p in seen.processes} <= set(cgroup_procs(owned.where))
    else:
        assert (owned.path, owned.where) == ("fallback", None) and "forced off by the test" in owned.why
    out = io.StringIO()
    render_status(StatusReport("spec.toml", [], {"ownership": dict(owned._asdict())}), out, as_json=False)
    assert f"ownership: {owned.path}" in out.getvalue() and owned.why in out.getvalue()
    server_action.ensure_stopped(spec)
    if owned.where:
        assert not os.path.exists(owned.where)  # emptied with cgroup.kill and removed


def test_a_cgroup_the_child_cannot_enter_falls_back_and_says_why(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from actions import cgroups as cgroup_actions
    from reconcile.ownership.cgroups import cgroup_path

    def refused(self: cgroup_actions.Entry) -> None:
        os.write(self.fd, b"not-a-pid")  # the kernel answers EINVAL, as it would EBUSY or EOPNOTSUPP

    monkeypatch.setattr(cgroup_actions.Entry, "enter", refused)
    spec = deployment.spec()
    result = server_action.ensure_running(spec, INPUTS)
    assert "started" in result.message
    seen = server.probe(spec)
    assert seen.server is not None
    assert seen.ownership.path == "fallback" and seen.ownership.where is None
    if request.node.callspec.params["deployment"] == "cgroup":
        assert "could not enter cgroup" in seen.ownership.why
        path = cgroup_path(spec)
        assert path is not None and not os.path.exists(path)  # the unused cgroup was removed
    # the fallback still knows its own: the launch is recorded with its start time
    assert server_action.ensure_stopped(spec).changed and server.probe(spec).processes == ()
