"""The layering (import-linter contracts in pyproject.toml), ruff and mypy --strict, in the test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def test_layers_are_kept() -> None:
    out = _run(_tool("lint-imports"), "--no-cache")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and " 0 broken" in out.stdout


def test_ruff_is_clean() -> None:
    out = _run(_tool("ruff"), "check", ".")
    assert out.returncode == 0, out.stdout[-3000:]


def test_mypy_strict_is_clean() -> None:
    out = _run(_tool("mypy"))
    assert out.returncode == 0, out.stdout[-3000:]
