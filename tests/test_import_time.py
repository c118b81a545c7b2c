"""benchmarks/import_time.py: a warm, converged plan and the timer's no-op apply import nothing that
benchmarks/import_never_warm.txt names.

Runs the script's own check (one priming run, one run reading sys.modules at exit) with this test
venv's interpreter on a small converged spec: the apt packages this machine has and a key file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "import_time.py"


@pytest.fixture
def converged(tmp_path: Path) -> Path:
    key = tmp_path / "api.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    spec = tmp_path / "converged.toml"
    owner = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
    spec.write_text(
        f'[machine]\nstate_dir = "{tmp_path}/state"\n\n[apt]\npackages = ["bash", "coreutils"]\n\n'
        f'[api_key]\nfile = "{key}"\nowner = "{owner}"\n'
    )
    plan = subprocess.run(
        [sys.executable, "-m", "reconcile", "plan", "--spec", str(spec)], capture_output=True, text=True
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr  # converged, or the check would not apply
    return spec


def _check(spec: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--python", sys.executable, "--spec", str(spec), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def test_a_warm_converged_plan_and_the_no_op_apply_import_nothing_the_list_forbids(converged: Path) -> None:
    done = _check(converged)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a warm, converged plan imports" in done.stdout
    assert "the timer's no-op apply imports" in done.stdout
    assert done.stdout.count("none that import_never_warm.txt names") == 2


def test_a_module_the_list_names_fails_the_check_by_name(converged: Path, tmp_path: Path) -> None:
    """Both runs import reconcile.spec.key (the spec cache's key) and probes.apt: listed, they fail it,
    by name (a module below a listed one counts: `probes` covers probes.apt)."""
    never = tmp_path / "never.txt"
    never.write_text(
        (REPO / "benchmarks" / "import_never_warm.txt").read_text() + "reconcile.spec.key\nprobes\n"
    )
    done = _check(converged, "--never", str(never))
    assert done.returncode == 1
    assert "a warm, converged plan (`reconcile plan --spec" in done.stderr
    assert "the timer's no-op apply (`reconcile apply --scheduled --spec" in done.stderr
    assert "must never import: " in done.stderr and "probes.apt" in done.stderr
    assert "reconcile.spec.key" in done.stderr


def test_a_spec_that_is_not_converged_is_never_applied_by_the_check(tmp_path: Path) -> None:
    key = tmp_path / "api.key"  # absent: an apply would generate it
    spec = tmp_path / "drift.toml"
    spec.write_text(f'[machine]\nstate_dir = "{tmp_path}/state"\n\n[api_key]\nfile = "{key}"\n')
    done = _check(spec)
    assert done.returncode == 1
    assert "is not converged (plan exited 2): apply not checked" in done.stdout
    assert not key.exists()
