"""Issue 19 on two H200s with real vLLM 0.26.0 at tensor-parallel-size 2, NVLink multicast off in the
server's environment (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).

1. nothing -> healthy (timed); 5a. the plan's predicted "GPU KV cache size" vs vLLM's log line;
2. kill -9 of the API server: both VLLM::Worker_TP* found through the ownership (cgroup or the recorded
   members: the figures say which), stopped, NVML per GPU released, the server back;
3. a foreign CUDA process on GPU 1 (as `nobody`, else root in its own session, no marker): listed by
   the plan, named by host.gpu-free for a greedy spec, never signalled through a stray cleanup;
4. generations A -> B (max-model-len) -> rollback to A, each switch timed;
5b. tools/preflight_serve_check.py --tp 2 on a sliding-window tiny model (RECONCILE_GPU_LAB_TP2_MODEL
   picks another, e.g. mamba-hybrid): predicted vs logged KV cache size.
Skipped unless RECONCILE_GPU_LAB=1 and two GPUs. Figures: $OUT/gpu-lab-tp2.json (+ preflight-serve-tp2.*).

On the lab machine (kind nvidia-h200-x2), the vLLM wheelhouse unpacked in /tmp/wheelhouse as for
tools/gpu_lab.sh, carry [".whl", ".lab"]; two calls of about 5 and 6 minutes (each under 10):
    TINY_MODEL_SCRIPT=.lab/make_tiny_model.py GPU_LAB_TESTS=tests/test_gpu_lab_tp2.py \\
        tools/gpu_lab.sh -k "healthy or kv_cache or kill_9 or foreign"
    TINY_MODEL_SCRIPT=.lab/make_tiny_model.py GPU_LAB_TESTS=tests/test_gpu_lab_tp2.py \\
        tools/gpu_lab.sh -k "generations or serve_check"
The second brings A up itself when the machine is fresh (add ~1.5 minutes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_lab import (
    GPU_LAB_MARKS,
    LAB,
    MULTI_GPU_ENV,
    ROOT,
    cli,
    dump_figures,
    get,
    gpu_count,
    kill_server_and_find_strays,
    plan_json,
    server_pid,
    starts_in_log,
    tp2_variant,
)

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
WORKER = "VLLM::Worker_TP"  # comm: the title cut to 15 bytes
HOG_GIB = 2
NOBODY = 65534
SERVE_MODEL = os.environ.get("RECONCILE_GPU_LAB_TP2_MODEL", "sliding")


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    if gpu_count() < 2:
        pytest.skip("needs two GPUs (kind nvidia-h200-x2)")
    yield
    dump_figures(FIGURES, "gpu-lab-tp2.json")
    cli("apply", "--spec", stop_spec())


def spec_a() -> str:
    return tp2_variant("tp2-a")


def stop_spec() -> str:
    return tp2_variant("tp2-stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'})


def per_gpu() -> list[dict[str, Any]]:
    """NVML per GPU: used GiB (v2: without the driver's reserve) and pid -> GiB of each process."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            used = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
            procs = {
                p.pid: round((p.usedGpuMemory or 0) / 2**30, 2)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            }
            out.append({"index": i, "used_gib": round(used / 2**30, 2), "processes": procs})
        return out
    finally:
        pynvml.nvmlShutdown()


def workers(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in data["observed"]["server"]["processes"] if p["name"].startswith(WORKER)]


def start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def record() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((LAB / "state" / "server-tiny.json").read_text())
    return data


def test_tp2_from_nothing_to_healthy_with_multicast_off() -> None:
    for sub in ("venv", "models", "state", "api.key", "tiny.log"):
        p = LAB / sub
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    FIGURES["nvml_idle"] = per_gpu()
    spec = spec_a()
    data = plan_json(spec)
    FIGURES["plan_from_nothing_s"] = round(data["_took"], 2)
    assert data["_code"] == 2, data["findings"]
    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["apply_from_nothing_s"] = round(took, 1)
    assert code == 2
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 1024
    data = plan_json(spec)
    assert data["_code"] == 0, [r["summary"] for r in data["resources"] if r["status"] != "ok"]
    FIGURES["processes"] = [(p["pid"], p["name"], p["role"]) for p in data["observed"]["server"]["processes"]]
    FIGURES["nvml_healthy"] = gpus = per_gpu()
    pids = [p["pid"] for p in workers(data)]
    assert len(pids) == 2, FIGURES["processes"]
    # One worker on each GPU, each holding memory.
    assert sorted(sum(1 for pid in pids if pid in g["processes"]) for g in gpus) == [1, 1], gpus
    # NVLink multicast off in the server's environment: in /proc, else (setproctitle overwrote it) the
    # launch record's env.
    pid = server_pid()
    assert pid is not None
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    seen = {k: v for k, _, v in (e.decode(errors="replace").partition("=") for e in environ)}
    if "PATH" not in seen:
        seen = json.loads(record()["components"]["env.shown"])
        FIGURES["multicast_env_from"] = "launch record"
    else:
        FIGURES["multicast_env_from"] = f"/proc/{pid}/environ"
    assert {k: seen.get(k) for k in MULTI_GPU_ENV} == MULTI_GPU_ENV


def test_tp2_predicted_kv_cache_size_against_vllms_log() -> None:
    data = plan_json(spec_a())
    (fit,) = [f for f in data["findings"] if f["rule"] == "memory.fit"]
    log = (LAB / "tiny.log").read_text(errors="replace")
    logged = re.findall(r"GPU KV cache size: ([\d,]+) tokens", log)
    available = re.findall(r"\((Worker_TP\d) pid=\d+\).*Available KV cache memory: ([\d.]+) GiB", log)
    predicted = fit["evidence"]["predicted_kv_cache_tokens"]
    FIGURES["kv_cache_tokens"] = {
        "predicted": predicted,
        "vllm_logged": logged[-1] if logged else None,
        "kv_bytes_per_token_per_gpu": fit["evidence"]["kv_bytes_per_token_per_gpu"],
        "weights_per_gpu": fit["evidence"]["weights_per_gpu"],
        "budget_per_gpu": fit["evidence"]["budget"],
        "available_logged_gib": available[-2:],
        "table": fit["evidence"]["table"],
    }
    assert logged, "no 'GPU KV cache size' line in the log"
    actual = int(logged[-1].replace(",", ""))
    FIGURES["kv_cache_tokens"]["error_pct"] = error = round(100 * (predicted - actual) / actual, 2)
    assert fit["evidence"]["kv_bytes_per_token_per_gpu"] == 512  # 2 x 1 KV head/GPU x 64 x 2 B x 2 layers
    assert abs(error) <= 5.0, FIGURES["kv_cache_tokens"]


def test_kill_9_at_tp2_both_workers_found_by_ownership_stopped_and_both_gpus_released() -> None:
    spec = spec_a()
    before = per_gpu()
    strays, data, _on_gpu = kill_server_and_find_strays(spec, FIGURES, "strays_after_kill_9")
    zombies = [p for p in strays if p["name"].startswith(WORKER)]
    assert len(zombies) == 2, strays
    FIGURES["nvml_after_kill_9"] = held = per_gpu()
    assert sorted(sum(1 for p in zombies if p["pid"] in g["processes"]) for g in held) == [1, 1], held
    owned = data["observed"]["server"]["ownership"]
    FIGURES["ownership"] = owned
    print(f"\nOWNERSHIP PATH: {owned['path']} {owned.get('where') or ''} ({owned['why']})")
    if owned["path"] == "cgroup":
        procs = {int(x) for x in Path(owned["where"], "cgroup.procs").read_text().split()}
        FIGURES["workers_proven_by"] = "cgroup.procs"
        assert {p["pid"] for p in zombies} <= procs
    else:
        members = {m["pid"]: m["start"] for m in record()["members"]}
        FIGURES["workers_proven_by"] = "recorded members (pid, start time, boot id)"
        assert all(members.get(p["pid"]) == start_time(p["pid"]) for p in zombies), (members, zombies)
    assert data["_code"] == 2
    code, out, _err, took = cli("apply", "--spec", spec)
    FIGURES["cleanup_and_restart_s"] = round(took, 1)
    FIGURES["cleanup_line"] = next(
        (ln.strip() for ln in out.splitlines() if "server" in ln and "✓" in ln), ""
    )
    assert code == 2
    FIGURES["nvml_after_cleanup"] = after = per_gpu()
    assert not any(p["pid"] in g["processes"] for p in strays for g in after), after
    assert get("/health", with_key=False)[0] == 200
    FIGURES["used_gib_per_gpu"] = {
        "healthy": [g["used_gib"] for g in before],
        "after_kill_9": [g["used_gib"] for g in held],
        "after_cleanup": [g["used_gib"] for g in after],
    }
    assert len(workers(plan_json(spec))) == 2


@pytest.fixture
def foreign() -> Iterator[subprocess.Popen[str]]:
    """A torch process holding 2 GiB on GPU 1 that is not reconcile's: as `nobody` when it can open
    the GPU there, else root in a session of its own; no marker, no record, no cgroup of ours."""
    code = (
        f"import torch, time; x = torch.empty({HOG_GIB} << 30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(900)"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's order
    }
    for uid in (NOBODY, None):
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
                env=env,
                cwd="/",
                user=uid,
                group=uid,
                extra_groups=[] if uid is not None else None,
            )
        except OSError as exc:  # nobody may not be allowed to run the image's interpreter
            FIGURES[f"foreign_as_{uid}_failed"] = str(exc)
            continue
        assert proc.stdout is not None
        if proc.stdout.readline().startswith("holding"):
            FIGURES["foreign_uid"] = os.geteuid() if uid is None else uid
            yield proc
            proc.kill()
            proc.wait()
            return
        proc.wait()
    raise AssertionError("no torch process could hold GPU 1")


def test_foreign_cuda_process_on_gpu_1_reported_and_never_signalled(foreign: subprocess.Popen[str]) -> None:
    spec = spec_a()
    born = start_time(foreign.pid)
    gpus = per_gpu()
    FIGURES["foreign_on_gpu"] = [g["index"] for g in gpus if foreign.pid in g["processes"]]
    assert FIGURES["foreign_on_gpu"] == [1], gpus
    held = gpus[1]["processes"][foreign.pid]
    data = plan_json(spec)
    listed = {p["pid"] for g in data["observed"]["gpu"]["gpus"] if g["index"] == 1 for p in g["processes"]}
    assert foreign.pid in listed
    assert foreign.pid not in {p["pid"] for p in data["observed"]["server"]["processes"]}
    _code, out, _err, _took = cli("status", "--json", "--spec", spec)
    FIGURES["status_gpu_processes"] = json.loads(out).get("gpu_processes")
    # 0.99 x 139.8 GiB asks more than GPU 1 has beside the foreign 2 GiB; our own workers count as free.
    greedy = tp2_variant("tp2-greedy", {"gpu-memory-utilization = 0.3": "gpu-memory-utilization = 0.99"})
    data = plan_json(greedy)
    errors = [f for f in data["findings"] if f["severity"] == "error" and f["rule"] == "host.gpu-free"]
    FIGURES["foreign_refusal"] = [f["message"] for f in errors]
    named = [f["message"] for f in errors if f"pid {foreign.pid}," in f["message"]]
    assert [m[:6] for m in named] == ["GPU 1:"], errors
    ours = {p["pid"] for p in data["observed"]["server"]["processes"]}
    assert not any(f"pid {pid}," in f["message"] for f in errors for pid in ours)  # ours count as free
    before = starts_in_log()
    assert cli("apply", "--spec", greedy)[0] == 1 and starts_in_log() == before  # refused before vLLM runs
    # A stray cleanup with it there: only the deployment's processes are signalled.
    os.kill(server_pid() or 0, signal.SIGKILL)
    time.sleep(3)
    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["cleanup_with_foreign_s"] = round(took, 1)
    assert code == 2
    assert foreign.poll() is None and start_time(foreign.pid) == born  # the same process, never signalled
    assert per_gpu()[1]["processes"].get(foreign.pid) == held


def current_generation() -> int:
    index = json.loads((LAB / "state" / "profile" / "index.json").read_text())
    return int(index["current"])


def switch(label: str, *args: str) -> dict[str, Any]:
    """One switch, timed; the old tree's workers must be off both GPUs afterwards."""
    old = {p["pid"] for p in workers(plan_json(spec_a()))}
    code, out, err, took = cli(*args)
    assert code == 2, out + err
    time.sleep(2)  # NVML's process list trails the exit by a moment
    gpus = per_gpu()
    data = plan_json(spec_a())
    new = {p["pid"] for p in workers(data)}
    figures: dict[str, Any] = {
        "seconds": round(took, 1),
        "old_workers": sorted(old),
        "new_workers": sorted(new),
        "old_workers_still_on_gpu": sorted(pid for pid in old for g in gpus if pid in g["processes"]),
        "used_gib_per_gpu": [g["used_gib"] for g in gpus],
        "server_argv": " ".join(
            next(p["cmdline"] for p in data["observed"]["server"]["processes"] if p["role"] == "server")
        ),
    }
    FIGURES[label] = figures
    assert len(new) == 2 and not old & new and not figures["old_workers_still_on_gpu"], figures
    return figures


def test_generations_at_tp2_a_then_b_then_rollback_to_a() -> None:
    code, _out, _err, took = cli("apply", "--spec", spec_a())  # running already, unless the machine is fresh
    FIGURES["a_apply"] = {"exit": code, "seconds": round(took, 1)}
    assert code in (0, 2)
    a = current_generation()
    b_spec = tp2_variant("tp2-b", {"max-model-len = 1024": "max-model-len = 512"})
    b = switch("b_switch", "apply", "--spec", b_spec)
    assert "--max-model-len 512" in b["server_argv"] and "--tensor-parallel-size 2" in b["server_argv"]
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 512
    back = switch("rollback_to_a", "rollback", str(a), "--spec", b_spec)
    assert "--max-model-len 1024" in back["server_argv"] and "--tensor-parallel-size 2" in back["server_argv"]
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 1024
    code, out, _err, _took = cli("plan", "--spec", b_spec)
    assert code == 0 and f"held at generation {a} by rollback" in out, out
    FIGURES["history"] = cli("history", "--spec", b_spec)[1]
    assert cli("resume", "--spec", b_spec)[0] == 0


def test_preflight_serve_check_at_tp2_on_a_tiny_model() -> None:
    """tools/preflight_serve_check.py --tp 2 with the lab venv's interpreter (vLLM, and the image's
    torch and transformers through its .pth); the lab server stopped first so both GPUs are idle."""
    assert cli("apply", "--spec", stop_spec())[0] in (0, 2)
    out = Path(os.environ.get("OUT") or LAB / "out")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [str(LAB / "venv" / "bin" / "python"), "tools/preflight_serve_check.py", "--tp", "2", SERVE_MODEL],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), "PYTHONPATH": ""},
    )
    print(proc.stdout[-4000:], proc.stderr[-3000:])
    FIGURES["serve_check_s"] = round(time.monotonic() - started, 1)
    (row,) = json.loads((out / "preflight-serve-tp2.json").read_text())["rows"]
    FIGURES["serve_check"] = {k: v for k, v in row.items() if k != "tail"}
    assert row["tp"] == 2 and row["verdict_agrees"], row
    assert abs(row["capacity_error_pct"]) <= 5.0, row
