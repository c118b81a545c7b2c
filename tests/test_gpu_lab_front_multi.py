"""Two deployments behind the machine's one HAProxy on the H200 lab, real vLLM 0.26.0. Skipped unless
RECONCILE_GPU_LAB=1.

tests/test_gpu_lab_multi.py's two tiny-Llama deployments (`one` public on 8001, `two` on 8002), each
with [deployments.<name>.front] (colours on their Unix sockets, `vllm serve --uds`), both on GPU 0 at
gpu-memory-utilization 0.2: 0.2 x 2 (two's colours) + 0.2 (one) = 0.6 leaves room for a blue/green
switch of `two`. Loads run on both public ports while `two` switches; no request of either may fail,
be cut or refused, `one`'s pid stays, and one HAProxy master serves both throughout. Figures in
$OUT/gpu-lab-front-multi.json.

    GPU_LAB_TESTS=tests/test_gpu_lab_front_multi.py tools/gpu_lab.sh
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.switch_load_support import Load
from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, dump_figures
from tests.test_gpu_lab_multi import PORTS, STATE, multi_spec

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
FRONT_STATE = LAB / "state-front-multi"
TOKENS = 400  # the tiny Llama's max-model-len is 1024


def front_spec(name: str, *, two_args: str = "", running: bool = True) -> str:
    text = Path(multi_spec(f"front-{name}", share=0.2, two_args=two_args, running=running)).read_text()
    text = text.replace(f'state_dir = "{STATE}"', f'state_dir = "{FRONT_STATE}"')
    for dep in ("one", "two"):
        text += f"\n[deployments.{dep}.front]\n"
    path = LAB / f"spec-front-multi-{name}.toml"
    path.write_text(text)
    return str(path)


def key(dep: str) -> str:
    return (LAB / f"multi-{dep}.key").read_text().strip()


def color_pid(dep: str, color: str) -> int:
    return int((FRONT_STATE / "deployments" / dep / f"{dep}-{color}.pid").read_text().split()[0])


def front_pid() -> int:
    return int((FRONT_STATE / "front.pid").read_text().split()[0])


def wait_ok(load: Load, phase: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while load.tally(phase).ok < count and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-front-multi.json")
    cli("apply", "--spec", front_spec("stop", running=False), "--auto-approve")  # colours and HAProxy


def test_a_blue_green_switch_of_one_deployment_leaves_the_other_untouched_under_load() -> None:
    code, out, err, took = cli("apply", "--spec", front_spec("a"), "--auto-approve")
    FIGURES["apply_both_s"] = round(took, 1)
    assert code == 2, out + err
    master, one = front_pid(), color_pid("one", "blue")
    loads = {dep: Load(PORTS[dep], key(dep), dep, clients=4, tokens=TOKENS) for dep in PORTS}
    for load in loads.values():
        load.__enter__()
    try:
        for load in loads.values():
            wait_ok(load, "before", 4)
            load.phase = "switch"
        code, out, err, took = cli("apply", "--spec", front_spec("b", two_args=", max-num-seqs = 8"),
                                   "--auto-approve")  # fmt: skip
        FIGURES["switch_two_s"] = round(took, 1)
        FIGURES["switch_says"] = next((ln.strip() for ln in out.splitlines() if "blue/green:" in ln), None)
        for load in loads.values():
            load.phase = "after"
        for load in loads.values():
            wait_ok(load, "after", 4)
    finally:
        for load in loads.values():
            load.stop()
    FIGURES["loads"] = {dep: load.summary() for dep, load in loads.items()}
    assert code == 2, out + err
    assert "traffic moved to green" in out and "down for 0.0s" in out, out
    for dep, load in loads.items():
        s = load.summary()
        assert s["failed"] == 0 and s["cut"] == 0 and s["unserved"] == 0, (dep, s)
        assert load.tally("after").ok >= 4, dep
    assert color_pid("one", "blue") == one and front_pid() == master
    FIGURES["one_pid_kept"] = color_pid("one", "blue") == one
    FIGURES["one_haproxy_master"] = front_pid() == master
