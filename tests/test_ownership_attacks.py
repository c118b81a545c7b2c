"""Issue 12's attacks, for real: a recorded pid that comes round again, a stale or corrupt pidfile, a
listener of another user on the spec's port, an impostor carrying the marker and the launch digest.

Each runs on both ownership paths (the server's own cgroup, and the start-time fallback where no
cgroup can be made). The foreign processes are real, run as `nobody` where the attack is a local user's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import server as server_action
from actions.launching import LaunchInputs, launch_command
from probes import health, server
from reconcile.errors import ActionError
from reconcile.identity import IDENTITY, MARKER
from tests.test_server_support import Deployment, alive, deployment_in, start_and_probe, wait_for

NOBODY = 65534
INPUTS = LaunchInputs(packages={"vllm": "0.26.0"})
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's processes, ns_last_pid)")

# A listener that answers 200 to anything and writes each request's head to stdout.
SPY = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    sys.stdout.write(data.decode("latin-1") + "\n---\n")
    sys.stdout.flush()
    body = b'{"version": "0.26.0", "data": [{"id": "fake-model", "max_model_len": 4096}]}'
    with_len = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    try:
        c.sendall(with_len + body)
    except OSError:
        pass
    c.close()
"""


@pytest.fixture(params=["cgroup", "fallback"])
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    if request.param == "fallback":
        from reconcile import cgroups

        monkeypatch.setattr(cgroups, "cgroup_root", lambda: (None, "forced off by the test"))
    yield from deployment_in(tmp_path)


@pytest.fixture
def strangers() -> Iterator[list[int]]:
    """Pids of foreign processes a test made; teardown kills them (and only them)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = raw.rsplit(b")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
                out.append(int(entry))
    return out


def _daemon_session(strangers: list[int], pid: int | None = None) -> tuple[int, int]:
    """A session of someone else's: its leader (pid `pid` when given, via ns_last_pid) starts an
    `env -i` daemon (an environment without PATH, as setproctitle leaves one) and exits.
    Returns (session id, the daemon's pid)."""
    argv = ["/bin/sh", "-c", "env -i /bin/sleep 120 & exit 0"]
    for _ in range(500):
        if pid is not None:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        leader = subprocess.Popen(argv, start_new_session=True)
        leader.wait()  # reaped: the session's leader is gone, as our dead server's would be
        members = _session_members(leader.pid)
        strangers.extend(members)
        if pid is None or leader.pid == pid:
            (daemon,) = wait_for(lambda s=leader.pid: _session_members(s), 5, "the daemon")  # type: ignore[misc]
            return leader.pid, daemon
        for m in members:
            os.kill(m, signal.SIGKILL)
    raise AssertionError(f"pid {pid} never came round (the machine forks too much)")


def _kill_tree(seen: server.ServerObservation) -> None:
    for p in seen.processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # the API server is this test's child: reap it
        for p in seen.processes:
            os.waitpid(p.pid, 0)
    wait_for(lambda: not any(alive(p.pid) for p in seen.processes), 5, "the tree to die")


def _as_nobody(argv: list[str], env: dict[str, str], strangers: list[int]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv,
        env={"PATH": "/usr/bin:/bin", **env},
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        stdout=subprocess.PIPE,
        start_new_session=True,
        cwd="/",
    )
    strangers.append(proc.pid)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def _received(spy: subprocess.Popen[bytes]) -> str:
    spy.kill()
    out, _ = spy.communicate(timeout=5)
    return out.decode("latin-1")


# --- 1. a reused pid, a stale pidfile, a corrupt pidfile ----------------------------------------


@root_only
def test_a_recorded_pid_that_comes_round_again_is_a_stranger(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec, first = start_and_probe(d, INPUTS)
    recorded = first.server.pid
    _kill_tree(first)
    # Another program's session now has the id our launch record (and the pidfile) names.
    sid, daemon = _daemon_session(strangers, pid=recorded)
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
    sid, daemon = _daemon_session(strangers)
    d.state_dir.mkdir(mode=0o700)
    (d.state_dir / f"{d.name}.pid").write_text(f"{sid}\n")
    seen = server.probe(d.spec())
    assert seen.processes == () and seen.pidfile.state == "dead"
    assert not server_action.ensure_stopped(d.spec()).changed
    assert alive(daemon)


def _kernel_thread() -> int:
    for entry in sorted(os.listdir("/proc"), key=lambda e: int(e) if e.isdigit() else 0):
        if entry.isdigit() and int(entry) > 1:
            with contextlib.suppress(OSError):
                flags = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[6])
                if flags & 0x00200000:  # PF_KTHREAD
                    return int(entry)
    pytest.skip("no kernel thread visible (a pid namespace)")


@pytest.mark.parametrize("content", ["0", "1", "kthread", "-5", "binary"])
def test_a_corrupt_pidfile_is_said_in_one_line_and_lists_no_strays(
    deployment: Deployment, content: str
) -> None:
    d = deployment
    spec = d.spec()
    d.state_dir.mkdir(mode=0o700)
    pidfile = d.state_dir / f"{d.name}.pid"
    raw = {"kthread": f"{_kernel_thread()}\n".encode(), "binary": b"\xff\xfe\x00\x9c garbage\n"}.get(
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
    assert (d.state_dir / f"{d.name}.pid.corrupt").read_bytes() == raw


def test_a_binary_pidfile_beside_a_running_server_is_replaced_not_a_crash(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec()
    server_action.ensure_running(spec, INPUTS)
    pidfile = d.state_dir / f"{d.name}.pid"
    pidfile.write_bytes(b"\xff\xfe\x00\x9c")
    result = server_action.ensure_running(spec, INPUTS)  # was "UnicodeDecodeError (a bug)"
    assert "pidfile and record rewritten" in result.message
    assert server.probe(spec).pidfile.state == "ours"


# --- 2. the key goes to whoever listens on the port ---------------------------------------------


@root_only
def test_the_key_never_reaches_a_foreign_listener_on_the_port(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec = d.spec()
    spy = _as_nobody(["/usr/bin/python3", "-c", SPY, str(d.port)], {}, strangers)
    seen = health.probe(spec)
    check = health.chat_check(spec, timeout=5)
    listener = server.probe(spec).listener
    got = _received(spy)
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
    impostor = _as_nobody(
        ["/usr/bin/python3", "-c", SPY, str(d.port)], {MARKER: d.marker, IDENTITY: digest}, strangers
    )
    seen = server.probe(spec)
    assert seen.server is None and seen.processes == ()
    assert seen.listener.state == "foreign" and seen.listener.pid == impostor.pid
    with pytest.raises(ActionError, match=f"port {d.port} is held by pid {impostor.pid}.*nobody"):
        server_action.ensure_running(spec, INPUTS)
    assert not (d.state_dir / f"{d.name}.pid").exists()
    assert impostor.poll() is None  # never signalled
    assert d.key not in _received(impostor)


@root_only
def test_an_impostor_off_the_port_is_neither_adopted_nor_signalled(
    deployment: Deployment, strangers: list[int]
) -> None:
    d = deployment
    spec = d.spec(startup_timeout=3)
    digest = launch_command(spec, INPUTS).identity.digest
    code = "import time; print('ready', flush=True); time.sleep(120)"
    impostor = _as_nobody(["/usr/bin/python3", "-c", code], {MARKER: d.marker, IDENTITY: digest}, strangers)
    result = server_action.ensure_running(spec, INPUTS)
    assert "started" in result.message and str(impostor.pid) not in result.message
    seen = server.probe(spec)
    assert seen.server is not None and seen.server.pid != impostor.pid
    assert impostor.pid not in {p.pid for p in seen.processes}
    assert impostor.poll() is None


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
    other = _as_nobody(["/usr/bin/python3", "-c", code], {MARKER: d.marker}, strangers)
    assert server.probe(d.spec()).processes == ()
    assert not server_action.ensure_stopped(d.spec()).changed
    assert other.poll() is None


def test_status_says_which_ownership_path_is_in_use_and_why(
    deployment: Deployment, request: pytest.FixtureRequest
) -> None:
    import dataclasses
    import io

    from reconcile.cgroups import cgroup_name, cgroup_procs
    from reconcile.status import StatusReport, render_status

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
    render_status(StatusReport("spec.toml", [], {"ownership": dataclasses.asdict(owned)}), out, as_json=False)
    assert f"ownership: {owned.path}" in out.getvalue() and owned.why in out.getvalue()
    server_action.ensure_stopped(spec)
    if owned.where:
        assert not os.path.exists(owned.where)  # emptied with cgroup.kill and removed


def test_a_cgroup_the_child_cannot_enter_falls_back_and_says_why(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from actions import cgroups as cgroup_actions
    from reconcile.cgroups import cgroup_path

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
        spy = _as_nobody(["/usr/bin/python3", "-c", SPY, str(demo.port)], {}, strangers)
        run = demo.cli("plan")
        status = demo.cli("status")
        got = _received(spy)
        assert "sk-the-real-key" not in got and "authorization" not in got.lower()
        assert run.returncode == 1, run.output  # host.port: the port is held
        shown = f"port {demo.port} is held by `/usr/bin/python3 -c"
        assert shown in run.output and "of user nobody (pid " in run.output, run.output
        assert f"pid {spy.pid}" in run.output
        assert "ownership:" in status.output, status.output
        assert f"what answers on the port is not ours: pid {spy.pid} (user nobody" in status.output
        (held,) = [line for line in run.output.splitlines() if "is held by" in line]
        assert held.endswith("[host.port]")  # one line, though the spy's command line has newlines
