"""Every spec in specs/ is planned through the real CLI; the reference spec on a CPU-only machine
reports what issue 2's "done means" lists (run where the CI machine's toolkit layout is present)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MACHINES = sorted(p for p in (ROOT / "specs").glob("*.toml") if p.name != "base.toml")


def plan(spec: Path, tmp_path: Path) -> tuple[int, dict[str, object], str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-m", "reconcile", "plan", "--spec", str(spec), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


@pytest.mark.parametrize("spec", MACHINES, ids=lambda p: p.name)
def test_every_spec_plans_to_json_with_a_plan_exit_code(spec: Path, tmp_path: Path) -> None:
    code, data, _ = plan(spec, tmp_path)
    assert code in (0, 1, 2) and data["exit_code"] == code
    # A spec with [deployments]: one plan document per deployment, each with its server row.
    for doc in data["deployments"].values() if "deployments" in data else [data]:
        assert {r["resource"] for r in doc["resources"]} >= {"server"}


def _ci_like() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any NVML failure means: no GPU here
        return os.path.realpath("/usr/local/cuda") == "/usr/local/cuda-13.0"
    pynvml.nvmlShutdown()
    return False


@pytest.mark.skipif(not _ci_like(), reason="needs a CPU-only machine with /usr/local/cuda -> cuda-13.0")
def test_reference_plan_on_a_cpu_machine(tmp_path: Path) -> None:
    code, data, _ = plan(ROOT / "specs" / "blackwell-2x5090.toml", tmp_path)
    assert code == 2
    seen = data["observed"]
    assert seen["gpu"]["_type"] == "unavailable" and "NVML" in seen["gpu"]["reason"]
    by = {r["resource"]: r for r in data["resources"]}
    assert by["gpu"]["status"] == "drift" and "unavailable" in by["gpu"]["summary"]
    assert by["cuda.home"]["status"] == "ok" and seen["cuda"]["home"]["resolved"] == "/usr/local/cuda-13.0"
    assert "compute_120" in seen["cuda"]["nvcc"]["gpu_archs"]
    missing = {h["name"] for h in seen["cuda"]["headers"] if not h["paths"]}
    present = {h["name"] for h in seen["cuda"]["headers"] if h["paths"]}
    assert missing | present == {"cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h"}
    for header in ("cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h"):
        found = any(Path("/usr/local/cuda-13.0").glob(f"**/include/{header}"))
        assert (header in missing) == (not found), header
    packages = seen["apt"]["packages"]
    assert "libcurand-dev-13-0" in packages and all("state" in p for p in packages.values())
    for resource in ("venv", "model.files", "api_key", "server"):
        assert by[resource]["status"] == "change", resource
    assert seen["venv"]["_type"] == "absent" and seen["model"]["_type"] == "absent"
    assert seen["api_key"]["_type"] == "absent" and seen["server"]["processes"] == []
    # One resource owns each fact: the headers come with [apt] packages, so the cuda row waits for apt
    # instead of saying "add them to [apt].packages"; only the GPU is counted as what apply cannot fix.
    if missing:
        assert (by["cuda"]["status"], by["cuda"]["via"]) == ("change", "apt")
        assert "add them to [apt]" not in by["cuda"]["reason"]
    assert data["summary"]["cannot_fix"] == 1 and "Apply cannot fix 1: gpu" in data["summary"]["text"]
    unknown = set(seen["apt"]["unknown"] or ())
    for f in data["findings"]:
        if f["rule"] == "toolchain.headers" and "apply installs" in f["message"]:
            assert not unknown & set(f["message"].split("apply installs ", 1)[1].split(", "))
