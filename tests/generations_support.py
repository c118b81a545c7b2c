"""A local wheelhouse with two versions of a tiny package built in the test, and demo specs whose
venv is realized under a store from it. Imported by tests/test_generations*.py.

The package, `tinyserve`, installs a `vllm` console script that runs the fake vllm: the server
then runs from its generation's venv (`<store>/<hash>-venv/bin/python .../bin/vllm serve ...`).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomlkit

from tests.apply_support import Demo
from tests.test_server_support import FAKE_VLLM

VERSIONS = ("1.0", "2.0")
# Where nothing listens: an index or proxy there fails at once, as with the network down.
CLOSED = "http://127.0.0.1:9"


def build_wheelhouse(base: Path) -> Path:
    """Once per session: tinyserve 1.0 and 2.0 built with `pip wheel` from a source tree made here."""
    home = base / "tinyserve-wheelhouse"
    home.mkdir(parents=True, exist_ok=True)
    wheels = home / "wheels"
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "done").exists():
            return wheels
        for version in VERSIONS:
            src = home / f"src-{version}"
            (src / "tinyserve").mkdir(parents=True, exist_ok=True)
            (src / "pyproject.toml").write_text(
                '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
                f'[project]\nname = "tinyserve"\nversion = "{version}"\n\n'
                '[project.scripts]\nvllm = "tinyserve:main"\n'
            )
            (src / "tinyserve" / "__init__.py").write_text(
                f'"""A test package whose `vllm` runs the fake vllm."""\n__version__ = "{version}"\n'
                f"FAKE = {FAKE_VLLM!r}\n\n\ndef main() -> None:\n    import runpy, sys\n\n"
                "    sys.argv[0] = FAKE\n    runpy.run_path(FAKE, run_name='__main__')\n"
            )
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), f"{src}/"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
        (home / "done").touch()
    return wheels


def stored_spec(demo: Demo, wheels: Path, version: str = "1.0", **server: Any) -> Path:
    """The demo spec with its venv realized under `<root>/store` from the wheelhouse, serving with
    tinyserve's `vllm`; `server` sets [server] args / env entries (`args={...}`, `env={...}`)."""

    def edit(doc: Any) -> None:
        venv = doc["venv"]
        venv["store"] = str(demo.root / "store")
        venv["wheelhouse"] = str(wheels)
        venv["installer"] = "pip"
        packages = tomlkit.inline_table()
        packages.update({"tinyserve": f"=={version}"})
        venv["packages"] = packages
        del doc["server"]["executable"]
        for table in ("args", "env"):
            merged = tomlkit.inline_table()
            merged.update({**dict(doc["server"][table]), **server.get(table, {})})
            doc["server"][table] = merged
        if "config" in server:
            for key, value in server["config"].items():  # [model.config] may hold sub-tables
                doc["model"]["config"][key] = value
        if "server" in server:
            for key, value in server["server"].items():
                doc["server"][key] = value

    return demo.write_spec(edit)


def offline_env(demo: Demo) -> dict[str, str]:
    """The CLI's environment with every index and proxy pointed where nothing listens."""
    env = demo.env()
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "PIP_INDEX_URL", "UV_INDEX_URL"):
        env[key] = CLOSED
    env["PIP_EXTRA_INDEX_URL"] = CLOSED
    env["PIP_FIND_LINKS"] = CLOSED
    return env


def server_cmdline(demo: Demo) -> str:
    pid = int(demo.pidfile.read_text().split()[0])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().replace("\0", " ")


def realizations(demo: Demo) -> list[Path]:
    store = demo.root / "store"
    return sorted(p for p in store.iterdir() if p.name.endswith("-venv")) if store.is_dir() else []


def cli_env(demo: Demo, *args: str, env: dict[str, str]) -> Any:
    """demo.cli with another environment (offline)."""
    from tests.apply_support import Run

    argv = demo.command(*args)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, cwd=str(demo.root))
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    demo.runs.append(run)
    return run


def mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
