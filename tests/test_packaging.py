"""What a user installs: the wheel carries the data the engine knowledge reads at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_the_flags_table_and_the_packaged_model_configs(tmp_path: Path) -> None:
    # A copy without build/ or *.egg-info: leftovers of an earlier build would hide a missing rule.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(
        "build",
        "dist",
        "*.egg-info",
        ".git",
        ".venv",
        ".wh*",
        ".notes",
        "benchmarks",
        "__pycache__",
        ".*cache",
    )
    shutil.copytree(ROOT, src, ignore=skip)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("reconcile-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "reconcile/data/vllm_flags.json" in names
    assert "reconcile/data/models/nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4.json" in names
    assert {"probes/gpu.py", "actions/server.py", "reconcile/cli.py"} <= names
    assert not any(n.startswith("tests/") for n in names)
