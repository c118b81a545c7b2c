"""Shared pieces of the server lifecycle tests: a test-unique deployment around the fake `vllm`.

Imported by tests/test_server_*.py and tests/test_fake_vllm.py. Every process a test starts carries
the deployment's marker (or is the test's own Popen), and teardown kills exactly those.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actions import cgroups, supervising
from reconcile.identity import MARKER, marker_value
from reconcile.ownership.membership import scope_of
from reconcile.spec.models import Spec

FAKE_VLLM = str(Path(__file__).parent / "fakes" / "vllm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def generated_tokens(port: int, host: str = "127.0.0.1") -> float:
    """vllm:generation_tokens_total from the server's /metrics, read by Prometheus's own parser: how
    many tokens the engine really generated (summed over its label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    from reconcile.host import http_request

    text = http_request("GET", host, port, "/metrics", timeout=5).body.decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:generation_tokens_total"
    )


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    return supervising.is_alive(pid)


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                out.append(int(entry))
    return sorted(out)


def lock_is_held(path: Path) -> bool:
    import fcntl

    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


@dataclass
class Deployment:
    """A temp machine for one deployment: model dir, key file, state dir, a "GPU" lock dir, a free port."""

    root: Path
    name: str
    port: int
    key: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def hold(self) -> Path:
        return self.root / "gpus"

    @property
    def log(self) -> Path:
        return self.root / "log" / "vllm.log"

    @property
    def marker(self) -> str:
        return marker_value(self.name, str(self.state_dir))

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    def fake_env(self, **extra: str) -> dict[str, str]:
        return {
            "FAKE_VLLM_STARTUP_DELAY": "0.3",
            "FAKE_VLLM_HOLD": str(self.hold),
            "FAKE_VLLM_MAX_LIFETIME": "120",  # leak guard should a test die before its teardown
            **extra,
        }

    def spec(
        self, args: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None, **server: Any
    ) -> Spec:
        data: dict[str, Any] = {
            "machine": {"state_dir": str(self.state_dir)},
            "venv": {"path": str(self.root / "venv")},
            "cuda": {"home": str(self.root / "cuda")},
            "model": {"dir": str(self.model_dir)},
            "api_key": {"file": str(self.root / "api.key")},
            "server": {
                "name": self.name,
                "host": "127.0.0.1",
                "port": self.port,
                "served_model_name": "fake-model",
                "log": str(self.log),
                "startup_timeout": 20,
                "stop_timeout": 3,
                "args": dict(args or {}),
                "env": self.fake_env(**(env or {})),
                **server,
            },
            "health": {"timeout": 3},
        }
        return Spec.model_validate(data)

    def run_fake(self, argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The fake `vllm` started directly (not through the action), marked so teardown finds its tree."""
        full = {
            "PATH": f"{self.root}/venv/bin:{os.environ['PATH']}",  # python3 is the venv's, as in a launch
            "HOME": os.environ.get("HOME", "/root"),
            MARKER: self.marker,
            "VLLM_CACHE_ROOT": str(self.root / "vllm-cache"),  # its torch.compile cache: not root's ~/.cache
            **self.fake_env(),
            **(env or {}),
        }
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            proc = subprocess.Popen([FAKE_VLLM, *argv], env=full, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_and_probe(d: Deployment, inputs: Any) -> tuple[Spec, Any]:
    """The server started by the action, and the probe's first look at it (the server found)."""
    from actions import server as server_action
    from probes import server

    spec = d.spec()
    server_action.ensure_running(spec, inputs)
    first = server.probe(spec)
    assert first.server is not None
    return spec, first


def _cleanup(d: Deployment) -> None:
    scope = scope_of(d.spec())
    for pid in supervising.marked_pids(scope):
        supervising.signal_marked(pid, scope, signal.SIGKILL)
    for proc in d.procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not supervising.marked_pids(scope), 5.0, "the deployment's processes to go")
    if scope.cgroup is not None and cgroups.ours(scope.cgroup):
        cgroups.empty_and_remove(scope.cgroup)


def deployment_in(tmp_path: Path) -> Iterator[Deployment]:
    """The body of each test file's `deployment` fixture: set up, yield, kill what carries the marker."""
    d = Deployment(tmp_path, f"t-{uuid.uuid4().hex[:10]}", free_port(), f"sk-test-{uuid.uuid4().hex}")
    d.model_dir.mkdir()
    # A venv's layout: bin/vllm, and bin/python3 that the fake's `#!/usr/bin/env python3` finds first
    # on the server's PATH, as a real venv's entry point would run its own interpreter.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "vllm").symlink_to(FAKE_VLLM)
    (tmp_path / "venv" / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    (d.model_dir / "config.json").write_text(
        json.dumps({"max_position_embeddings": 4096, "model_type": "llama"})
    )
    key = tmp_path / "api.key"
    key.write_text(d.key + "\n")
    key.chmod(0o600)
    try:
        yield d
    finally:
        _cleanup(d)


def foreign_holder(d: Deployment, *, port: int | None = None, lock: bool = True) -> subprocess.Popen[bytes]:
    """A process WITHOUT our marker that looks like vLLM: `vllm serve` in its cmdline, holding the
    "GPU" lock and/or listening on a port. The test owns it (and kills it via d.procs)."""
    code = (
        "import fcntl, os, socket, sys, time\n"
        "hold, port = sys.argv[1], int(sys.argv[2])\n"
        "keep = []\n"
        "if hold != '-':\n"
        "    os.makedirs(hold, exist_ok=True); f = open(os.path.join(hold, 'cuda0.lock'), 'a+')\n"
        "    fcntl.flock(f, fcntl.LOCK_EX); keep.append(f)\n"
        "if port:\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('127.0.0.1', port)); s.listen(); keep.append(s)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    argv = [
        sys.executable,
        "-c",
        code,
        str(d.hold) if lock else "-",
        str(port or 0),
        "vllm",
        "serve",
        "/models/x",
    ]
    env = {"PATH": os.environ["PATH"]}  # no marker: not ours, whatever it looks like
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    d.procs.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    return proc
