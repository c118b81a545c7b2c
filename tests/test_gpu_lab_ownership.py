"""Issue 12 on a real GPU with real vLLM 0.26.0: after kill -9 of the API server, the stray
VLLM::EngineCore is found through the deployment's ownership (cgroup, or the recorded start times)
and stopped, NVML shows its memory released, and a foreign CUDA process of the same user survives.

Skipped unless RECONCILE_GPU_LAB=1. Run alone on the lab machine by
`GPU_LAB_TESTS=tests/test_gpu_lab_ownership.py tools/gpu_lab.sh`; it brings the lab spec up itself.
Figures are printed and written to $OUT/gpu-lab-ownership.json when $OUT is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_lab import (
    GPU_LAB_MARKS,
    cli,
    dump_figures,
    get,
    gpu_pids,
    kill_server_and_find_strays,
    plan_json,
    server_pid,
    variant,
)

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
HOG_GIB = 2


@pytest.fixture(scope="module")
def hog() -> Iterator[subprocess.Popen[str]]:
    """A CUDA process that is not reconcile's: same user (root), its own session, no marker, holding
    2 GiB. Nothing about it but its absence from our cgroup / records tells it from a stray."""
    code = (
        f"import torch, time; x = torch.empty({HOG_GIB} << 30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(900)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("RECONCILE")},
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("holding")
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-ownership.json")


def test_kill_9_stray_found_by_ownership_and_stopped_foreign_cuda_process_untouched(
    hog: subprocess.Popen[str],
) -> None:
    spec = variant("ownership", {})
    held_before = gpu_pids().get(hog.pid, 0)
    assert held_before >= HOG_GIB << 30, gpu_pids()
    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["apply_s"] = round(took, 1)
    assert code in (0, 2)
    assert get("/health", with_key=False)[0] == 200
    data = plan_json(spec)
    owned = data["observed"]["server"]["ownership"]
    FIGURES["ownership"] = owned  # which path ran here, and why
    print(f"\nOWNERSHIP PATH: {owned['path']} {owned.get('where') or ''} ({owned['why']})")
    code, out, _err, _took = cli("status", "--spec", spec)
    FIGURES["status_ownership_line"] = next((x.strip() for x in out.splitlines() if "ownership:" in x), None)
    members = data["observed"]["server"]["processes"]
    assert hog.pid not in {p["pid"] for p in members}
    if owned["path"] == "cgroup":
        procs = Path(owned["where"], "cgroup.procs").read_text().split()
        FIGURES["cgroup_procs"] = len(procs)
        assert str(hog.pid) not in procs and {str(p["pid"]) for p in members} <= set(procs)

    assert server_pid() is not None
    strays, data, on_gpu = kill_server_and_find_strays(spec, FIGURES, "strays_after_kill_9")
    engine = [p for p in strays if p["name"].startswith("VLLM::EngineCor")]
    assert engine and on_gpu.get(engine[0]["pid"], 0) > 0, (strays, on_gpu)
    assert hog.pid not in {p["pid"] for p in strays}
    assert data["_code"] == 2

    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["stray_cleanup_and_restart_s"] = round(took, 1)
    assert code == 2
    left = gpu_pids()
    FIGURES["nvml_after"] = {str(k): round(v / 2**30, 2) for k, v in left.items()}
    assert not {p["pid"] for p in strays} & set(left), left  # released
    assert hog.poll() is None and left.get(hog.pid, 0) == held_before  # untouched
    assert get("/health", with_key=False)[0] == 200

    stop = variant("ownership-stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'})
    code, _out, _err, _took = cli("apply", "--spec", stop)
    assert code == 2 and hog.poll() is None
    if owned["path"] == "cgroup":
        FIGURES["cgroup_removed_after_stop"] = not Path(owned["where"]).exists()
        assert FIGURES["cgroup_removed_after_stop"]
