"""Generations on the H200 lab machine with real vLLM 0.26.0 (issue 15). Skipped unless RECONCILE_GPU_LAB=1.

A (the lab spec, venv realized under a store), B (other args, a config.json key), C (an attention
backend this build lacks: vLLM rejects it at startup, which no preflight can know) rolls back by
itself to B, then `rollback 1` goes to A. Each switch is timed; between switches NVML must show
the old server's processes gone. Figures in $OUT/gpu-lab-generations.json.

    GPU_LAB_TESTS=tests/test_gpu_lab_generations.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, get, gpu_pids, starts_in_log, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
# FLASHINFER is a backend vLLM 0.26.0 knows, but the lab has no flashinfer package: the engine
# fails at startup. Another name can be given if this build turns out to accept it.
# What vLLM rejects at startup and the preflight cannot know. (An attention backend the build lacks
# no longer qualifies: the venv.features rule catches a missing flashinfer-python in the plan.)
BAD_ARG = os.environ.get("RECONCILE_GPU_LAB_BAD_ARG", 'tokenizer = "/opt/reconcile-lab/no-such-tokenizer"')
STORE = {
    'path = "/opt/reconcile-lab/venv"': (
        'path = "/opt/reconcile-lab/venv-profile"\nstore = "/opt/reconcile-lab/store"'
    )
}
B_ARGS = {
    "max-model-len = 1024": "max-model-len = 512",
    "factor = 2.0": "factor = 4.0",  # rope_parameters.factor: a config.json key of its own
}


def spec(name: str, extra: dict[str, str] | None = None) -> str:
    return variant(f"gen-{name}", {**STORE, **(extra or {})})


def journal_server_seconds() -> float:
    journal = LAB / "state" / "generations"
    records = [p for p in journal.glob("*.json") if p.stem.isdigit()]  # not index.json
    newest = max(records, key=lambda p: int(p.stem))
    changes = json.loads(newest.read_text())["changes"]
    return round(sum(float(c["seconds"]) for c in changes if c["resource"].endswith("server")), 1)


def server_pids_on_gpu() -> set[int]:
    """The deployment's processes (from the plan's observation) that NVML shows holding memory."""
    _code, out, _err, _took = cli("plan", "--spec", spec("a"), "--json")
    procs = json.loads(out)["observed"]["server"]["processes"]
    on_gpu = gpu_pids()
    return {p["pid"] for p in procs if p["pid"] in on_gpu}


def switch(label: str, *args: str, expect: int) -> tuple[str, set[int]]:
    """Run one switch; record its time and that the processes before it released their memory."""
    before = server_pids_on_gpu()
    code, out, err, took = cli(*args)
    assert code == expect, out + err
    time.sleep(2)  # NVML's process list trails the exit by a moment
    left = set(gpu_pids())
    FIGURES[label] = {
        "seconds": round(took, 1),
        "server_step_s": journal_server_seconds(),
        "old_pids": sorted(before),
        "old_pids_still_on_gpu": sorted(before & left),
        "gpu_used_gib_after": round(sum(gpu_pids().values()) / 2**30, 2),
    }
    assert not before & left, (label, before & left)
    return out, before


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    for sub in ("store", "venv-profile", "state/profile"):
        shutil.rmtree(LAB / sub, ignore_errors=True)
    yield
    print("\nFIGURES " + json.dumps(FIGURES, indent=2))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-lab-generations.json").write_text(json.dumps(FIGURES, indent=2))
    cli("apply", "--spec", spec("stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def test_generation_a_then_b_each_from_its_own_realization() -> None:
    switch("a_apply", "apply", "--spec", spec("a"), expect=2)
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 1024
    (a,) = list((LAB / "store").glob("*-venv"))
    starts = starts_in_log()
    switch("b_switch", "apply", "--spec", spec("b", B_ARGS), expect=2)
    assert starts_in_log() == starts + 1
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 512
    cfg = json.loads((LAB / "models/tiny-llama/config.json").read_text())
    assert cfg["rope_parameters"]["factor"] == 4.0
    # B's venv inputs are A's: the same realization, nothing installed.
    assert list((LAB / "store").glob("*-venv")) == [a]
    code, out, _err, _took = cli("diff", "1", "2", "--spec", spec("b", B_ARGS))
    assert code == 0 and "--max-model-len 1024 -> 512" in out and "rope_parameters.factor 2.0 -> 4.0" in out


def test_generation_c_that_vllm_rejects_at_startup_rolls_back_to_b_by_itself() -> None:
    c = spec("c", {**B_ARGS, "enforce-eager = true": f"enforce-eager = true, {BAD_ARG}"})
    code, out, _err, _took = cli("plan", "--spec", c)
    assert code == 2, out  # the preflight cannot know: the plan is a plain restart
    out, _before = switch("c_auto_rollback", "apply", "--spec", c, expect=4)
    FIGURES["c_reason"] = next((ln for ln in out.splitlines() if "automatic rollback to" in ln), "")
    assert "automatic rollback to generation 2: the server did not become ready" in out, out
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 512  # B serves again
    code, out, _err, _took = cli("check", "--spec", c)
    assert code == 0, out
    starts = starts_in_log()
    code, out, _err, took = cli("apply", "--scheduled", "--spec", c)
    FIGURES["scheduled_after_failure_s"] = round(took, 1)
    assert code == 0 and starts_in_log() == starts, out  # no retry each tick


def test_manual_rollback_to_a_holds() -> None:
    c = str(LAB / "spec-gen-c.toml")
    out, _before = switch("rollback_to_a", "rollback", "1", "--spec", c, expect=2)
    assert "rolled back to generation 1" in out
    assert get("/v1/models")[1]["data"][0]["max_model_len"] == 1024
    cfg = json.loads((LAB / "models/tiny-llama/config.json").read_text())
    assert cfg["rope_parameters"]["factor"] == 2.0
    code, out, _err, _took = cli("plan", "--spec", c)
    assert code == 0 and "held at generation 1 by rollback" in out, out
    code, out, _err, _took = cli("history", "--spec", c)
    FIGURES["history"] = out
