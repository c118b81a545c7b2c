"""A private copy of the CPU demo spec for each test, and the `reconcile` CLI run for real against it.

Imported by tests/test_apply_*.py and tests/test_crash_safety.py. Each copy lives under the test's
tmp_path with its own server name and a free port; `stop_servers` ends what carries its marker.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from actions import supervising
from reconcile.identity import marker_value
from reconcile.ownership.membership import Scope, scope_of
from reconcile.spec.loader import load_spec
from tests.test_server_support import FAKE_VLLM, free_port

REPO = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO / "specs" / "cpu-demo.toml"
DEMO_MODEL = REPO / "specs" / "demo-model"
KILL_AT = "RECONCILE_TEST_KILL_AT"


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Demo:
    """One test's copy of specs/cpu-demo.toml: every path under `root`, its own name and port."""

    root: Path
    name: str
    port: int
    runs: list[Run] = field(default_factory=list)

    @property
    def spec_path(self) -> Path:
        return self.root / "spec" / "demo.toml"

    @property
    def marker(self) -> str:
        return marker_value(self.name, str(self.state_dir))

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def model_dir(self) -> Path:
        return self.root / "models" / "demo"

    @property
    def key_file(self) -> Path:
        return self.root / "api.key"

    @property
    def log(self) -> Path:
        return self.root / "demo.log"

    @property
    def pidfile(self) -> Path:
        return self.root / "demo.pid"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "apply.lock"

    @property
    def last_run(self) -> Path:
        return self.state_dir / "last-run.json"

    def write_spec(self, edit: Any = None, path: Path | None = None) -> Path:
        """The demo spec with our paths, name and port; `edit(doc)` may change the tomlkit document."""
        text = DEMO_SPEC.read_text().replace("/tmp/reconcile-demo", str(self.root))
        text = text.replace("{spec_dir}/demo-model", str(DEMO_MODEL))
        text = text.replace("{spec_dir}/../tests/fakes/vllm", str(FAKE_VLLM))
        doc = tomlkit.parse(text)
        server = doc["server"]
        server["name"] = self.name
        server["served_model_name"] = self.name
        server["port"] = self.port
        env = tomlkit.inline_table()
        env.update(dict(server["env"]))
        # The fake's "GPU" is a lock file: ours alone; a short load; a leak guard should we die.
        env.update(
            FAKE_VLLM_HOLD=str(self.root / "gpus"),
            FAKE_VLLM_STARTUP_DELAY="0.1",
            FAKE_VLLM_MAX_LIFETIME="600",
        )
        server["env"] = env
        if edit is not None:
            edit(doc)
        target = path or self.spec_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tomlkit.dumps(doc))
        return target

    def command(self, *args: str, spec: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "reconcile", *args, "--spec", str(spec or self.spec_path)]

    def env(self, kill_at: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != KILL_AT}
        if kill_at is not None:
            env[KILL_AT] = kill_at
        return env

    def cli(
        self,
        *args: str,
        spec: Path | None = None,
        timeout: float = 180,
        kill_at: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Run:
        argv = self.command(*args, spec=spec)
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env(kill_at), **(env or {})},
            cwd=str(self.root),
        )
        run = Run(argv, proc.returncode, proc.stdout, proc.stderr)
        self.runs.append(run)
        return run

    def start(
        self, *args: str, kill_at: str | None = None, spec: Path | None = None
    ) -> subprocess.Popen[str]:
        """The CLI in the background, in its own process group (so a test can kill it with its children),
        with SIGINT at its default as on a terminal: a suite started as a shell's background job
        (`pytest &`) inherits SIGINT ignored, and a test's Ctrl-C would then never arrive."""
        return subprocess.Popen(
            self.command(*args, spec=spec),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(kill_at),
            cwd=str(self.root),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def finish(self, proc: subprocess.Popen[str], timeout: float = 180) -> Run:
        out, err = proc.communicate(timeout=timeout)
        run = Run([str(a) for a in proc.args], proc.returncode, out, err)  # type: ignore[union-attr]
        self.runs.append(run)
        return run

    def generations(self) -> list[dict[str, Any]]:
        directory = self.state_dir / "generations"
        if not directory.is_dir():
            return []
        numbers = sorted(int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit())
        return [json.loads((directory / f"{n}.json").read_text()) for n in numbers]

    def scope(self) -> Scope | str:
        """What proves this demo's processes (its cgroup, its records, its marker); the marker alone
        when the spec on disk does not load (a test broke it on purpose)."""
        try:
            return scope_of(load_spec(str(self.spec_path)).spec)
        except Exception:
            return self.marker

    def server_pids(self) -> list[int]:
        return supervising.marked_pids(self.scope())

    def server_environ(self, key: str) -> str | None:
        pid = int(self.pidfile.read_text().split()[0])
        return supervising.environ_value(pid, key)

    def starts_in_log(self) -> int:
        """Server starts recorded in its log by actions.server (one `--- reconcile` line each)."""
        if not self.log.exists():
            return 0
        return sum(
            1
            for line in self.log.read_text(errors="replace").splitlines()
            if line.startswith("--- reconcile") and "starting" in line
        )


def stop_servers(demo: Demo) -> None:
    """Teardown: every process of this demo, then its cgroup (a whole stop removes it)."""
    supervising.stop_marked(demo.scope(), timeout=5.0)


def demo_in(tmp_path: Path, seed: Path | None = None) -> Iterator[Demo]:
    """The body of a `demo` fixture: a fresh copy of the demo spec (and a copied venv when `seed`)."""
    demo = Demo(tmp_path, f"demo-{uuid.uuid4().hex[:10]}", free_port())
    demo.write_spec()
    if seed is not None:
        copy_venv(seed, demo.venv)
    try:
        yield demo
    finally:
        stop_servers(demo)


def copy_venv(seed: Path, target: Path) -> None:
    """A real venv made once by `reconcile apply`, copied: directories anew, files hard-linked (pip,
    venv and importlib replace files by rename, never write into them), the interpreter link as is."""
    shutil.copytree(seed, target, symlinks=True, copy_function=os.link)


def seed_venv(base: Path, packages: Mapping[str, str]) -> Path:
    """Once per test session: a venv made by a real `reconcile apply` of a spec with only [venv]."""
    tag = hashlib.sha256(json.dumps(dict(packages), sort_keys=True).encode()).hexdigest()[:10]
    home = base / f"seed-venv-{tag}"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers share the base directory
        venv = home / "venv"
        if (home / "done").exists():
            return venv
        table = ", ".join(f'"{k}" = "{v}"' for k, v in packages.items())
        spec = home / "seed.toml"
        spec.write_text(
            f'[machine]\nstate_dir = "{home}/state"\n\n[venv]\npath = "{venv}"\npackages = {{ {table} }}\n'
        )
        proc = subprocess.run(
            [sys.executable, "-m", "reconcile", "apply", "--spec", str(spec)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode in (0, 2), proc.stdout + proc.stderr
        (home / "done").touch()
        return venv


def tree_state(root: Path, exclude: set[Path]) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under `root` (links not followed): (mtime_ns, size, mode)."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            if path in exclude:
                continue
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_mtime_ns, st.st_size, st.st_mode)
    return out


def cmdlines() -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out.append(f.read().decode(errors="replace"))
            except OSError:
                continue
    return out


def group_member(pgid: int, needle: str) -> bool:
    """A process of group `pgid` whose command line holds `needle` is running."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmd and os.getpgid(int(entry)) == pgid:
                return True
        except OSError:
            continue
    return False
