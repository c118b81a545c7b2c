"""Shared pieces of issue 12's ownership tests: the deployment on both ownership paths, foreign
processes (run as `nobody` where the attack is another local user's) and a listener that records.

Imported by tests/test_ownership_pids.py and tests/test_ownership_key.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions.launching import LaunchInputs
from probes import server
from tests.test_server_support import Deployment, alive, deployment_in, wait_for

NOBODY = 65534
NOGROUP = 65534  # nogroup, nobody's group on Debian
INPUTS = LaunchInputs(packages={"vllm": "0.26.0"})
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's processes, ns_last_pid)")

# A listener that answers 200 to anything and writes each request's head to stdout; on 127.0.0.1, or on
# the address argv[2] (an IPv6 one dual-stack: it takes IPv4's connections too).
SPY = r"""
import socket, sys
address = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if ":" in address:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind((address, int(sys.argv[1])))
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


PATHS = ["cgroup", "fallback"]


def deployment_on(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    """The body of each file's `deployment` fixture: a deployment on ownership path `path` (the
    fallback: as on a machine where no cgroup can be made)."""
    if path == "fallback":
        from reconcile.ownership import cgroups

        monkeypatch.setattr(cgroups, "cgroup_root", lambda: (None, "forced off by the test"))
    yield from deployment_in(tmp_path)


def foreign_pids() -> Iterator[list[int]]:
    """The body of conftest's `strangers` fixture: pids of the foreign processes a test made;
    teardown kills them (and only them)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def session_members(sid: int) -> list[int]:
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


def daemon_session(strangers: list[int], pid: int | None = None) -> tuple[int, int]:
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
        members = session_members(leader.pid)
        strangers.extend(members)
        if pid is None or leader.pid == pid:
            (daemon,) = wait_for(lambda s=leader.pid: session_members(s), 5, "the daemon")  # type: ignore[misc]
            return leader.pid, daemon
        for m in members:
            os.kill(m, signal.SIGKILL)
    raise AssertionError(f"pid {pid} never came round (the machine forks too much)")


def kill_tree(seen: server.ServerObservation) -> None:
    for p in seen.processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # the API server is this test's child: reap it
        for p in seen.processes:
            os.waitpid(p.pid, 0)
    wait_for(lambda: not any(alive(p.pid) for p in seen.processes), 5, "the tree to die")


def as_nobody(argv: list[str], env: dict[str, str], strangers: list[int]) -> subprocess.Popen[bytes]:
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


def listening_as_nobody(strangers: list[int], host: str = "127.0.0.1") -> int:
    """A free port on `host` that nobody now listens on (accepting nothing); returns the port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port = int(probe.getsockname()[1])
    family = "AF_INET6" if ":" in host else "AF_INET"
    code = (
        f"import socket, time\ns = socket.socket(socket.{family})\ns.bind(({host!r}, {port}))\n"
        "s.listen(1)\nprint('ready', flush=True)\ntime.sleep(600)\n"
    )
    as_nobody(["/usr/bin/python3", "-c", code], {}, strangers)
    return port


def received(spy: subprocess.Popen[bytes]) -> str:
    spy.kill()
    out, _ = spy.communicate(timeout=5)
    return out.decode("latin-1")


def kernel_thread() -> int:
    for entry in sorted(os.listdir("/proc"), key=lambda e: int(e) if e.isdigit() else 0):
        if entry.isdigit() and int(entry) > 1:
            with contextlib.suppress(OSError):
                flags = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[6])
                if flags & 0x00200000:  # PF_KTHREAD
                    return int(entry)
    pytest.skip("no kernel thread visible (a pid namespace)")


def nobodys_dir(parent: Path, name: str) -> Path:
    """A directory `name` under `parent`, made by root and given to nobody."""
    path = parent / name
    path.mkdir()
    os.chown(path, NOBODY, NOGROUP)
    return path
