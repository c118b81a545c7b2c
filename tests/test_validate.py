"""`reconcile validate DIR`: every spec of a directory loaded and preflighted offline, one line per
problem, exit 1 on an error (the fleet repository's CI check). Run through the real CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconcile", "validate", *args], capture_output=True, text=True, timeout=120
    )


def test_the_bundled_specs_pass_and_a_base_is_checked_through_its_users() -> None:
    out = validate(str(REPO / "specs"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{REPO / 'specs' / 'base.toml'}: a base, checked through blackwell-2x5090.toml" in out.stdout
    assert out.stdout.strip().endswith("4 spec(s) checked, 0 failed")  # with cpu-demo-multi.toml


def test_a_bad_spec_and_a_preflight_error_fail_with_one_line_each(tmp_path: Path) -> None:
    fleet = tmp_path / "specs"
    fleet.mkdir()
    shutil.copytree(REPO / "specs" / "demo-model", fleet / "demo-model")  # validate reads only the fleet's
    demo = (REPO / "specs" / "cpu-demo.toml").read_text().replace("{spec_dir}/..", str(REPO))
    (fleet / "good.toml").write_text(demo)
    (fleet / "too-long.toml").write_text(demo.replace("max-model-len = 2048", "max-model-len = 100000"))
    (fleet / "bad.toml").write_text(demo.replace("port = 18000", "port = true"))
    shutil.copy(REPO / "specs" / "demo-model" / "config.json", tmp_path / "unrelated.json")
    out = validate(str(fleet))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    port_line = next(
        n for n, t in enumerate((fleet / "bad.toml").read_text().splitlines(), 1) if "port =" in t
    )
    assert any(line.startswith(f"{fleet / 'bad.toml'}:{port_line}: server.port: ") for line in lines), lines
    assert any(
        line.startswith(f"{fleet / 'too-long.toml'}: error max-model-len.derived: max-model-len 100,000")
        for line in lines
    ), lines
    assert f"{fleet / 'good.toml'}: ok (2 warning(s) above)" in lines
    assert lines[-1] == "3 spec(s) checked, 2 failed"
    strict = validate("--strict", str(fleet))
    assert strict.returncode == 1 and strict.stdout.splitlines()[-1] == "3 spec(s) checked, 3 failed"


def test_no_spec_or_no_directory_is_one_clear_line(tmp_path: Path) -> None:
    out = validate(str(tmp_path))
    assert out.returncode == 1 and out.stderr == f"reconcile: {tmp_path}: no *.toml spec in it\n"
