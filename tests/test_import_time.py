"""benchmarks/import_time.py: a warm, converged plan imports only what import_allowlist.txt allows.

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


def test_a_warm_converged_plan_imports_only_allowed_modules(converged: Path) -> None:
    done = _check(converged)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a warm, converged plan imports" in done.stdout and "all in import_allowlist.txt" in done.stdout
    assert "the timer's no-op apply imports" in done.stdout
    assert "all in import_allowlist_apply.txt" in done.stdout


def test_a_module_the_apply_list_does_not_allow_fails_the_check_by_name(
    converged: Path, tmp_path: Path
) -> None:
    allowed = (REPO / "benchmarks" / "import_allowlist_apply.txt").read_text().splitlines()
    short = tmp_path / "allow-apply.txt"
    short.write_text("\n".join(m for m in allowed if m != "reconcile.apply.executor") + "\n")
    done = _check(converged, "--apply-allowlist", str(short))
    assert done.returncode == 1
    assert "the timer's no-op apply (`reconcile apply --scheduled --spec" in done.stderr
    assert "does not allow: reconcile.apply.executor." in done.stderr


def test_a_spec_that_is_not_converged_is_never_applied_by_the_check(tmp_path: Path) -> None:
    key = tmp_path / "api.key"  # absent: an apply would generate it
    spec = tmp_path / "drift.toml"
    spec.write_text(f'[machine]\nstate_dir = "{tmp_path}/state"\n\n[api_key]\nfile = "{key}"\n')
    done = _check(spec)
    assert done.returncode == 1
    assert "is not converged (plan exited 2): apply not checked" in done.stdout
    assert not key.exists()


def test_a_module_the_list_does_not_allow_fails_the_check_by_name(converged: Path, tmp_path: Path) -> None:
    allowed = (REPO / "benchmarks" / "import_allowlist.txt").read_text().splitlines()
    short = tmp_path / "allow.txt"
    short.write_text(
        "\n".join(m for m in allowed if m not in ("probes.dpkg_status", "reconcile.spec.key")) + "\n"
    )
    done = _check(converged, "--allowlist", str(short))
    assert done.returncode == 1
    assert "does not allow: probes.dpkg_status, reconcile.spec.key." in done.stderr
