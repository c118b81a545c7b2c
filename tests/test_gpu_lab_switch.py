"""Switches under load on the H200 lab with real vLLM 0.26.0 (issue 30). Skipped unless RECONCILE_GPU_LAB=1.

The reference's load, 8 concurrent streams (a new connection per request, a refused one retried
after 50 ms; tests/switch_load_support.py), runs through: A -> B (`reconcile apply`, the old server
drains with reconcile's default --shutdown-timeout), B -> A (`reconcile rollback`, drains too), then
the same switch with `shutdown-timeout = 0` (vLLM's own default: abort) for comparison. Per switch:
whole, cut (an answer had started) and failed requests, those the gap did not serve (refused, and
unanswered: reset before any answer, as a connection queued on vLLM's closing listener is), the gap,
and apply's "prepared in X s, down for Y s" (tests/switch_load_support.py counts them).
Then blue/green: the same spec with [front] (apt's haproxy on port 8000, vLLM on its colors' Unix sockets;
gpu-memory-utilization 0.3 leaves room for both), the same load through a switch and a rollback.
Figures in $OUT/gpu-lab-switch.json, written after each switch (a call cut by its time limit keeps
what it saw). Expected duration on the H200: about 7 minutes (the drain test ~4 min: a start and four
switches of ~45 s each, as the 2026-12-02 run reached the blue/green test before 320 s; blue/green
~3 min: a start, two switches, the stops); give the call its 600 s limit.

    GPU_LAB_TESTS=tests/test_gpu_lab_switch.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.switch_load_support import Load
from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, key, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
TOKENS = 400  # the tiny Llama's max-model-len is 1024
UTIL = "gpu-memory-utilization = 0.3"


FRONT_AT = 'VLLM_USE_FLASHINFER_SAMPLER = "0"'
FRONT = {FRONT_AT: f"{FRONT_AT}\n\n[front]"}  # the colors on their Unix sockets (vllm serve --uds)


def spec(name: str, util: str, drain: str = "", extra: dict[str, str] | None = None) -> str:
    return variant(f"switch-{name}", {UTIL: f"gpu-memory-utilization = {util}{drain}", **(extra or {})})


def wait_ok(load: Load, phase: str, count: int = 8, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while load.tally(phase).ok < count and time.monotonic() < deadline:
        time.sleep(0.2)


def switched(load: Load, label: str, *args: str) -> dict[str, Any]:
    load.phase = label
    code, out, err, took = cli(*args)
    assert code in (0, 2), out + err
    line = re.search(r"prepared in [\d.]+s.*?down for [\d.]+s", out)
    load.phase = f"after {label}"
    wait_ok(load, load.phase)
    t = load.tally(label)
    FIGURES[label] = {"seconds": round(took, 1), "apply_says": line.group(0) if line else None,
                      "whole": t.ok, "cut": t.cut, "failed": t.failed, "refused": t.refused,
                      "unanswered": t.unanswered, "errors": t.errors[:5]}  # fmt: skip
    _save()  # after each switch: a call cut short by its time limit still brings back what it saw
    return FIGURES[label]


def _save() -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-lab-switch.json").write_text(json.dumps(FIGURES, indent=2))


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    print("\nFIGURES " + json.dumps(FIGURES, indent=2))
    _save()
    stop_all()


STOP = {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}


def stop_all() -> None:
    """Both the plain server and the fronted colors stopped; our HAProxy master (root's haproxy whose
    command line names the lab's front config) ended."""
    cli("apply", "--spec", variant("switch-stop", STOP))
    cli("apply", "--spec", variant("switch-stop-front", {**STOP, **FRONT}))
    pidfile, config = LAB / "state" / "front-tiny.pid", str(LAB / "state" / "front-tiny.cfg")
    try:
        pid = int(pidfile.read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if os.readlink(f"/proc/{pid}/exe").endswith("haproxy") and config.encode() in argv:
            os.kill(pid, 15)
    except (OSError, ValueError, IndexError):
        pass


def test_drain_restart_cuts_no_stream_and_abort_cuts_them() -> None:
    code, out, err, _took = cli("apply", "--spec", spec("a", "0.3"))
    assert code in (0, 2), out + err
    assert (
        "--shutdown-timeout" in (LAB / "tiny.log").read_text(errors="replace").splitlines()[-200:].__str__()
    )
    with Load(8000, key(), "tiny", tokens=TOKENS) as load:
        wait_ok(load, "before")
        drain = switched(load, "drain_switch", "apply", "--spec", spec("b", "0.31"))
        back = switched(load, "drain_rollback", "rollback", "--spec", spec("b", "0.31"))
        # The abort way: first a server started with shutdown-timeout = 0 (the old one still drains) ...
        switched(load, "to_abort_spec", "apply", "--spec", spec("c", "0.3", ", shutdown-timeout = 0"))
        # ... then a switch away from it: vLLM aborts the streams in flight.
        abort = switched(load, "abort_switch", "apply", "--spec", spec("d", "0.31", ", shutdown-timeout = 0"))
    FIGURES["gap_s_longest"] = load.gap()
    _save()
    for label, f in (("drain switch", drain), ("drain rollback", back)):
        assert f["cut"] == 0 and f["failed"] == 0, (
            f"{label}: {f['cut']} cut in flight and {f['failed']} failed (want 0 and 0); "
            f"not served during the gap: {f['refused']} refused + {f['unanswered']} unanswered; "
            f"{f['whole']} whole; apply said {f['apply_says']!r}; errors {f['errors']}"
        )
    FIGURES["abort_cut_some"] = abort["cut"] > 0  # expected with a load in flight; a figure, not a rule


def test_blue_green_fails_no_request_across_a_switch_and_a_rollback() -> None:
    stop_all()  # port 8000 is the front's from here on
    code, out, err, _took = cli("apply", "--spec", spec("bg-a", "0.3", extra=FRONT))
    assert code in (0, 2), out + err
    assert "started haproxy" in out
    code, out, err, _took = cli("plan", "--spec", spec("bg-b", "0.31", extra=FRONT))
    FIGURES["bg_plan_switch_line"] = next((ln.strip() for ln in out.splitlines() if "switch:" in ln), "")
    assert "-> blue/green" in FIGURES["bg_plan_switch_line"], out
    with Load(8000, key(), "tiny", tokens=TOKENS) as load:
        wait_ok(load, "before")
        bg = switched(load, "bg_switch", "apply", "--spec", spec("bg-b", "0.31", extra=FRONT))
        bg_back = switched(load, "bg_rollback", "rollback", "--spec", spec("bg-b", "0.31", extra=FRONT))
    FIGURES["bg_gap_s_longest"] = load.gap()
    _save()
    for label, f in (("blue/green switch", bg), ("blue/green rollback", bg_back)):
        assert f["failed"] == 0 and f["cut"] == 0 and f["refused"] == 0 and f["unanswered"] == 0, (
            f"{label}: {f['failed']} failed, {f['cut']} cut, {f['refused']} refused, {f['unanswered']} "
            f"unanswered (want 0 each); {f['whole']} whole; apply said {f['apply_says']!r}; "
            f"errors {f['errors']}"
        )
