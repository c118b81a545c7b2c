"""The benchmarks' own venvs under benchmarks/.venvs/, made on first use: `reconcile` installed as a user
installs it (`pip install .`, byte-compiled, no editable import hook), and the comparison tools.

Imported by the scripts beside it. ansible-core and pyinfra live only here, never in the test venv.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENVS = HERE / ".venvs"
RECONCILE_VENV = VENVS / "reconcile"
TOOLS_VENV = VENVS / "tools"
TOOLS = ("ansible-core", "pyinfra")
DEMO_SPEC = REPO / "specs" / "cpu-demo.toml"
REFERENCE_SPEC = REPO / "specs" / "blackwell-2x5090.toml"


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"benchmarks: {' '.join(argv)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def _sources_digest() -> str:
    """What `pip install .` would install: a new digest means the installed copy is stale."""
    digest = hashlib.sha256()
    files = [REPO / "pyproject.toml"]
    for package in ("reconcile", "probes", "actions"):
        files += sorted(
            p for p in (REPO / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _make_venv(path: Path, python: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Like `python -m venv` of 3.13: the tree ignores itself, so no `git add` can pick it up.
    (path.parent / ".gitignore").write_text("# made by benchmarks/benchenv.py\n*\n")
    if not (path / "bin" / "python").exists():
        _run([python, "-m", "venv", str(path)])


def reconcile_venv(python: str = sys.executable) -> Path:
    """benchmarks/.venvs/reconcile with this checkout installed non-editable (again when it changed)."""
    _make_venv(RECONCILE_VENV, python)
    stamp = RECONCILE_VENV / ".installed-from"
    want = _sources_digest()
    if not stamp.exists() or stamp.read_text() != want:
        print(f"benchmarks: pip install {REPO} into {RECONCILE_VENV} (non-editable) ...", file=sys.stderr)
        _run(
            [
                str(RECONCILE_VENV / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--force-reinstall",
                "--no-deps",
                str(REPO),
            ]
        )
        _run([str(RECONCILE_VENV / "bin" / "python"), "-m", "pip", "install", "-q", str(REPO)])
        stamp.write_text(want)
    return RECONCILE_VENV / "bin" / "reconcile"


def tools_venv(python: str = sys.executable) -> Path:
    """benchmarks/.venvs/tools with ansible-core and pyinfra from PyPI; returns its bin directory."""
    _make_venv(TOOLS_VENV, python)
    bin_dir = TOOLS_VENV / "bin"
    if not (bin_dir / "ansible-playbook").exists() or not (bin_dir / "pyinfra").exists():
        print(f"benchmarks: pip install {' '.join(TOOLS)} into {TOOLS_VENV} ...", file=sys.stderr)
        _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", *TOOLS])
    return bin_dir


def versions(bin_dir: Path) -> dict[str, str]:
    out = {}
    for tool in TOOLS:
        proc = subprocess.run(
            [str(bin_dir / "python"), "-m", "pip", "show", tool], capture_output=True, text=True
        )
        out[tool] = next(
            (ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines() if ln.startswith("Version:")), "?"
        )
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell would give: no PYTHONDONTWRITEBYTECODE games, no test hooks."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RECONCILE_TEST", "PYTHONDONTWRITEBYTECODE"))
    }
    env.update(extra)
    return env


def machine() -> str:
    """One line: CPU model and count, kernel, Python."""
    import platform

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


if __name__ == "__main__":
    print(reconcile_venv())
    print(tools_venv())
    print(versions(TOOLS_VENV / "bin"))
