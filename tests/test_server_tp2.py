"""Tensor parallel 2 under the ownership of issue 12 (issue 19): the reference's zombie workers.

The CPU demo at tensor-parallel-size 2 on two fake H200s (tests/fakes/fake_nvml.HeldNvml: a GPU lists
the fake vllm worker holding its lock, 43.6 GiB, until that process exits). kill -9 of the API server
leaves EngineCore and both workers; the plan owns them through the cgroup, or the recorded members
where no cgroup can be made; apply stops them, NVML shows both GPUs released, the server is back.
Processes on GPU 1 that are not ours (another uid carrying our marker; same uid, a worker's title, no
proof) are reported and never signalled. Plan and apply run in-process (the fake NVML is this
process's pynvml). Generations A -> B (args) -> rollback to A relaunch the whole tree each time.
The GPU lab repeats all of it on real vLLM: tests/test_gpu_lab_tp2.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from reconcile.identity import MARKER
from reconcile.ownership.membership import proc_id, read_stat
from tests.apply_support import Demo, demo_in, seed_venv
from tests.fakes.fake_nvml import GIB, FakeProcess, HeldNvml, h200, lock_holders
from tests.ownership_support import PATHS, as_nobody
from tests.test_server_support import alive, children_of, cmdline, wait_for

NVCC = Path(__file__).resolve().parent / "fixtures" / "nvcc"
WORKER = "VLLM::Worker_TP"  # comm: setproctitle's title cut to 15 bytes
STRANGER_GIB = 2


def toolkit(root: Path) -> Path:
    """A CUDA 13.0 home whose nvcc prints what the real one does (tests/fixtures/nvcc): with a GPU in
    the spec, the preflight wants one, as FlashInfer's JIT does."""
    home = root / "cuda-13.0"
    if not home.exists():
        (home / "bin").mkdir(parents=True)
        nvcc = home / "bin" / "nvcc"
        nvcc.write_text(
            f'#!/bin/sh\ncase "$1" in\n--version) cat {NVCC}/13.0-version.txt ;;\n'
            f"--list-gpu-arch) cat {NVCC}/13.0-list-gpu-arch.txt ;;\nesac\n"
        )
        nvcc.chmod(0o755)
    return home


def tp2_spec(demo: Demo, **args: Any) -> Path:
    """The demo at tensor-parallel-size 2 on the two fake H200s (its [gpu] section says so)."""

    def edit(doc: Any) -> None:
        gpu = tomlkit.table()
        gpu.update({"count": 2, "name": "NVIDIA H200", "compute_capability": "9.0"})
        doc["gpu"] = gpu
        cuda = tomlkit.table()
        cuda.update({"home": str(toolkit(demo.root)), "gpu_arch": ["compute_90"]})
        doc["cuda"] = cuda
        doc["server"]["args"]["tensor-parallel-size"] = 2
        for key, value in args.items():
            doc["server"]["args"][key] = value

    return demo.write_spec(edit)


@pytest.fixture(params=PATHS)
def tp2(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Demo, HeldNvml]]:
    """The demo (its venv seeded) at TP 2 on ownership path `cgroup` or `fallback`, and its fake NVML."""
    from reconcile.ownership import cgroups

    if request.param == "fallback":
        monkeypatch.setattr(cgroups, "cgroup_root", lambda: (None, "forced off by the test"))
    elif cgroups.cgroup_root()[0] is None:
        pytest.skip(f"no cgroup path on this machine: {cgroups.cgroup_root()[1]}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for demo in demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"})):
        tp2_spec(demo)
        nvml = h200(2, hold=str(demo.root / "gpus"))
        assert isinstance(nvml, HeldNvml)
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        yield demo, nvml


def plan(demo: Demo) -> Any:
    from reconcile.plan.planner import make_plan
    from reconcile.spec.loader import load_spec

    return make_plan(load_spec(str(demo.spec_path)))


def apply(demo: Demo) -> Any:
    from reconcile.apply.changes import apply_spec
    from reconcile.spec.loader import load_spec

    report = apply_spec(load_spec(str(demo.spec_path)), lock_timeout=10, progress=lambda _line: None)
    errors = [f.message for f in (report.first_plan.errors if report.first_plan else ())]
    assert report.exit_code == 2, (report.refused, errors, report.results, report.notes)
    return report


def on_gpus(nvml: HeldNvml) -> dict[int, dict[int, int]]:
    """GPU index -> {pid: bytes} as NVML lists them, and each GPU's used bytes under key -1."""
    nvml.nvmlInit()
    try:
        out = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            procs = {p.pid: p.usedGpuMemory or 0 for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}
            out[i] = {**procs, -1: nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2).used}
        return out
    finally:
        nvml.nvmlShutdown()


def processes(data: Any) -> list[dict[str, Any]]:
    procs: list[dict[str, Any]] = data.observed["server"]["processes"]
    return procs


def hold_gpu_1(nvml: HeldNvml, pid: int) -> None:
    """What the driver would show for a CUDA process of `pid` on GPU 1 (the fake has no CUDA)."""
    gpu = nvml.gpus[1]
    gpu.processes.append(FakeProcess(pid, STRANGER_GIB * GIB))
    gpu.memory_used += STRANGER_GIB * GIB


def stranger_same_uid(strangers: list[int]) -> int:
    """Same user, its own session, no marker and no record, named like a worker: nothing proves it ours."""
    code = (
        "import ctypes, time; ctypes.CDLL(None).prctl(15, b'VLLM::Worker_TP1', 0, 0, 0); "
        "print('ready', flush=True); time.sleep(300)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    strangers.append(proc.pid)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc.pid


def stranger_other_uid(strangers: list[int], marker: str) -> int | None:
    """`nobody`, carrying a copy of our marker (anyone can read it from a listing): never a member."""
    if os.geteuid() != 0:
        return None
    code = "import time; print('ready', flush=True); time.sleep(300)"
    return as_nobody(["/usr/bin/python3", "-c", code], {MARKER: marker}, strangers).pid


def test_kill_9_at_tp_2_leaves_both_workers_which_the_plan_owns_and_apply_stops_and_frees(
    tp2: tuple[Demo, HeldNvml], strangers: list[int], request: pytest.FixtureRequest
) -> None:
    demo, nvml = tp2
    path = request.node.callspec.params["tp2"]
    others = [p for p in (stranger_same_uid(strangers), stranger_other_uid(strangers, demo.marker)) if p]
    for pid in others:
        hold_gpu_1(nvml, pid)
    started = {pid: proc_id(pid) for pid in others}
    idle = on_gpus(nvml)

    apply(demo)
    first = plan(demo)
    assert first.exit_code == 0, [c.summary for c in first.changes]
    tree = processes(first)
    assert sorted(p["name"] for p in tree) == sorted(["vllm", "VLLM::EngineCor", WORKER, WORKER])
    workers = sorted(p["pid"] for p in tree if p["name"] == WORKER)
    gpus = on_gpus(nvml)
    holders = [set(gpus[i]) & set(workers) for i in (0, 1)]
    assert [len(h) for h in holders] == [1, 1] and holders[0] | holders[1] == set(workers)  # one each
    assert all(gpus[i][-1] == idle[i][-1] + int(43.6 * GIB) for i in (0, 1))
    assert not set(others) & {p["pid"] for p in tree}

    server = int(demo.pidfile.read_text())
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not alive(server), 5, "the API server to die")
    after = plan(demo)
    strays = processes(after)
    assert {p["pid"] for p in strays} == {p["pid"] for p in tree} - {server}
    assert all(p["role"] == "stray" for p in strays)
    assert sorted(lock_holders(str(demo.root / "gpus")).values()) == workers  # still "holding 43.6 GiB" each
    # Which proof found them: the cgroup, or (no cgroup) the members recorded while it was healthy.
    owned = after.observed["server"]["ownership"]
    assert owned["path"] == path, owned
    if path == "cgroup":
        procs = {int(x) for x in Path(owned["where"], "cgroup.procs").read_text().split()}
        assert set(workers) <= procs and not set(others) & procs
    else:
        assert owned["why"] == "forced off by the test"
        record = json.loads((demo.state_dir / f"server-{demo.name}.json").read_text())
        members = {m["pid"]: m["start"] for m in record["members"]}
        for pid in workers:  # the marker is gone from their environ (setproctitle), the leader is dead
            assert members[pid] == read_stat(pid).start  # type: ignore[union-attr]
            with open(f"/proc/{pid}/environ", "rb") as f:
                assert MARKER.encode() not in f.read()
    change = next(c for c in after.changes if c.resource == "server")
    assert change.kind == "+" and "first stop 3 stray process(es) of a dead server" in change.summary
    # The plan reports what is not ours on GPU 1, and a greedy spec is refused because of it alone.
    listed = {p["pid"] for g in after.observed["gpu"]["gpus"] if g["index"] == 1 for p in g["processes"]}
    assert set(others) <= listed
    tp2_spec(demo, **{"gpu-memory-utilization": 0.99})
    greedy = plan(demo)
    (refusal,) = [f for f in greedy.errors if f.rule == "host.gpu-free"]
    assert refusal.message.startswith("GPU 1: ") and all(f"pid {p}," in refusal.message for p in others)
    assert not any(f"pid {p}," in refusal.message for p in workers)  # ours count as free: apply stops them
    tp2_spec(demo)

    report = apply(demo)
    assert any("stopped 3 process(es)" in r.message for r in report.results if r.resource == "server")
    assert not any(alive(pid) for pid in workers)
    released = on_gpus(nvml)
    assert not any(set(released[i]) & set(workers) for i in (0, 1))
    back = processes(plan(demo))
    new_workers = sorted(p["pid"] for p in back if p["name"] == WORKER)
    assert len(new_workers) == 2 and not set(new_workers) & set(workers)
    assert sorted(lock_holders(str(demo.root / "gpus")).values()) == new_workers
    assert all(released[i][-1] == idle[i][-1] + int(43.6 * GIB) for i in (0, 1))  # the new workers only
    for pid in others:  # never signalled: the very same process, still there
        assert alive(pid) and proc_id(pid) == started[pid]
    assert plan(demo).exit_code == 0


def launched_tree(demo: Demo) -> dict[str, Any]:
    """The running server's tree as /proc shows it: its argv, EngineCore under it, the workers under
    that (each holding one GPU lock)."""
    server = int(demo.pidfile.read_text())
    (engine,) = children_of(server)
    workers = children_of(engine)
    assert [Path(f"/proc/{p}/comm").read_text().strip() for p in (engine, *workers)] == [
        "VLLM::EngineCor",
        WORKER,
        WORKER,
    ]
    assert sorted(lock_holders(str(demo.root / "gpus")).values()) == workers
    return {"argv": cmdline(server).split(), "pids": {server, engine, *workers}}


def test_generations_at_tp_2_a_then_b_then_rollback_to_a_relaunch_the_whole_tree(seeded: Demo) -> None:
    seeded.write_spec(lambda doc: doc["server"]["args"].update({"tensor-parallel-size": 2}))
    assert seeded.cli("apply").returncode == 2
    a = launched_tree(seeded)
    assert "--tensor-parallel-size 2" in " ".join(a["argv"]) and "--max-num-seqs 4" in " ".join(a["argv"])

    seeded.write_spec(
        lambda doc: doc["server"]["args"].update({"tensor-parallel-size": 2, "max-num-seqs": 8})
    )
    switched = seeded.cli("apply")
    assert switched.returncode == 2, switched.output
    b = launched_tree(seeded)
    assert not any(alive(p) for p in a["pids"])  # A's EngineCore and both workers too, not just its server
    assert "--max-num-seqs 8" in " ".join(b["argv"]) and "--tensor-parallel-size 2" in " ".join(b["argv"])
    assert " ".join(b["argv"]).replace("--max-num-seqs 8", "--max-num-seqs 4") == " ".join(a["argv"])

    back = seeded.cli("rollback", "1")
    assert back.returncode == 2 and "rolled back to generation 1" in back.stdout, back.output
    again = launched_tree(seeded)
    assert not any(alive(p) for p in b["pids"])
    assert again["argv"] == a["argv"] and not again["pids"] & a["pids"]
    assert seeded.starts_in_log() == 3
    held = seeded.cli("plan")
    assert held.returncode == 0 and "held at generation 1 by rollback" in held.stdout, held.output
