"""Taking [front] away on the H200 lab with real vLLM 0.26.0 and apt's haproxy. Skipped unless
RECONCILE_GPU_LAB=1.

The bug seen on the lab: `tiny` behind [front] (HAProxy on 8000, vLLM on 8001/8002), then a spec
without [front]: the plan wanted `start tiny on 127.0.0.1:8000` and the preflight refused it, our own
HAProxy holding 8000; `running = false` without [front] left HAProxy running. Here, with the load of
tests/switch_load_support.py on 8000: front -> no front in one apply (the gap counted: refused and
unanswered during the drain and the plain server's start), then front again and `running = false`
without it (everything stops). Figures in $OUT/gpu-lab-front-off.json. Expected on the H200: about
3 minutes (three starts of the tiny Llama, two drains); give the call its 600 s limit.

    GPU_LAB_TESTS=tests/test_gpu_lab_front_off.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.switch_load_support import Load
from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, get, key
from tests.test_gpu_lab_switch import FRONT, STOP, TOKENS, spec, stop_all

pytestmark = GPU_LAB_MARKS

FIGURES: dict[str, Any] = {}


def _save() -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-lab-front-off.json").write_text(json.dumps(FIGURES, indent=2))


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    print("\nFIGURES " + json.dumps(FIGURES, indent=2))
    _save()
    stop_all()


def _our_master() -> int | None:
    """Root's haproxy whose command line names the lab's front config, as the pidfile says."""
    pidfile, config = LAB / "state" / "front-tiny.pid", str(LAB / "state" / "front-tiny.cfg")
    try:
        pid = int(pidfile.read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        ours = os.readlink(f"/proc/{pid}/exe").endswith("haproxy") and config.encode() in argv
        return pid if ours else None
    except (OSError, ValueError, IndexError):
        return None


def test_front_taken_away_in_one_apply_and_running_false_stops_everything() -> None:
    stop_all()
    code, out, err, _took = cli("apply", "--spec", spec("off-a", "0.3", extra=FRONT))
    assert code in (0, 2) and "started haproxy" in out, out + err
    master = _our_master()
    assert master is not None
    code, out, err, _took = cli("plan", "--spec", spec("off-b", "0.3"))
    FIGURES["plan"] = [ln.strip() for ln in out.splitlines() if "haproxy" in ln or "start tiny" in ln]
    assert f"stop haproxy (pid {master})" in out and "held by" not in out, out + err
    with Load(8000, key(), "tiny", tokens=TOKENS) as load:
        deadline = time.monotonic() + 120
        while load.tally("before").ok < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        load.phase = "take away"
        code, out, err, took = cli("apply", "--spec", spec("off-b", "0.3"))
        load.phase = "after"
        deadline = time.monotonic() + 120
        while load.tally("after").ok < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
    t = load.tally("take away")
    FIGURES["take_away"] = {"exit": code, "seconds": round(took, 1), "gap_s": round(load.gap(), 2),
                            "whole": t.ok, "cut": t.cut, "failed": t.failed, "refused": t.refused,
                            "unanswered": t.unanswered, "errors": t.errors[:5]}  # fmt: skip
    _save()
    assert code in (0, 2), out + err
    assert _our_master() is None and get("/v1/models")[0] == 200
    assert t.cut == 0 and t.failed == 0, FIGURES["take_away"]  # the color drained
    code, out, err, _took = cli("plan", "--spec", spec("off-b", "0.3"))
    assert code == 0, out + err
    # Front again, then running = false without it: HAProxy and every color stop.
    code, out, err, _took = cli("apply", "--spec", spec("off-a", "0.3", extra=FRONT))
    assert code in (0, 2) and _our_master() is not None, out + err
    code, out, err, _took = cli("apply", "--spec", spec("off-stop", "0.3", extra=STOP))
    FIGURES["stopped"] = {"exit": code, "haproxy_left": _our_master()}
    _save()
    assert code in (0, 2) and "stopped haproxy" in out, out + err
    assert _our_master() is None
