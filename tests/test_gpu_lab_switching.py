"""One numbering, one truth, with real vLLM 0.26.0 on the H200 lab (issue 26, items 4 and 5). Skipped
unless RECONCILE_GPU_LAB=1.

A, then B (other max-model-len), `rollback 1` to A; then C (B's args plus one vLLM rejects at start)
must go back by itself to A, the generation serving, not to B, the newest good one; a typo in
`[server] executable` is refused by `plan` and `apply` with the server untouched; after `resume`, a
saved plan of B applied with `apply FILE` prints a generation `history` marks `*`. At each step the
generation `history` marks is the one whose max-model-len `/v1/models` reports. Figures (each step's
seconds; the automatic rollback's server step, vLLM's start included) in $OUT/gpu-lab-switching.json.

    GPU_LAB_TESTS=tests/test_gpu_lab_switching.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, dump_figures, get, server_pid, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
PROFILE = 'path = "/opt/reconcile-lab/venv-profile"\nstore = "/opt/reconcile-lab/store"'
STORE = {'path = "/opt/reconcile-lab/venv"': PROFILE}
B = {"max-model-len = 1024": "max-model-len = 512"}
BAD_ARG = os.environ.get("RECONCILE_GPU_LAB_BAD_ARG", 'tokenizer = "/opt/reconcile-lab/no-such-tokenizer"')


def spec(name: str, extra: dict[str, str] | None = None) -> str:
    return variant(f"switch-{name}", {**STORE, **(extra or {})})


def max_len() -> int:
    return int(get("/v1/models")[1]["data"][0]["max_model_len"])


def marked(spec_path: str) -> int:
    code, out, _err, _took = cli("history", "--spec", spec_path)
    assert code == 0, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("*")]
    return int(line[1:].split()[0])


def step(label: str, *args: str, expect: int) -> str:
    code, out, err, took = cli(*args)
    FIGURES[label] = {"seconds": round(took, 1), "exit": code}
    assert code == expect, out + err
    return out


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    for sub in ("store", "venv-profile", "state/profile"):
        shutil.rmtree(LAB / sub, ignore_errors=True)
    yield
    dump_figures(FIGURES, "gpu-lab-switching.json")
    cli("apply", "--spec", variant("stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def test_a_failed_switch_goes_back_to_the_generation_serving_and_history_agrees() -> None:
    a, b = spec("a"), spec("b", B)
    step("a_apply", "apply", "--spec", a, expect=2)
    assert max_len() == 1024 and marked(a) == 1
    step("b_apply", "apply", "--spec", b, expect=2)
    assert max_len() == 512 and marked(b) == 2
    step("rollback_to_1", "rollback", "1", "--auto-approve", "--spec", b, expect=2)
    assert max_len() == 1024 and marked(b) == 1

    c = spec("c", {"enforce-eager = true": f"enforce-eager = true, {BAD_ARG}"})
    out = step("c_auto_rollback", "apply", "--spec", c, expect=4)
    assert "automatic rollback to generation 1:" in out, out
    assert max_len() == 1024 and marked(c) == 1
    journal = LAB / "state" / "generations"
    newest = max((p for p in journal.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    changes = json.loads(newest.read_text())["changes"]
    server_s = sum(float(ch["seconds"]) for ch in changes if ch["resource"].endswith("server"))
    FIGURES["c_rollback_server_step_s"] = round(server_s, 1)


def test_a_typo_in_the_executable_is_refused_before_anything_stops() -> None:
    pid = server_pid()
    typo = spec(
        "typo", {'\nname = "tiny"': '\nname = "tiny"\nexecutable = "/opt/reconcile-lab/venv-profile/bin/vlm"'}
    )
    out = step("typo_plan", "plan", "--spec", typo, expect=1)
    assert "[server].executable /opt/reconcile-lab/venv-profile/bin/vlm does not exist" in out, out
    step("typo_apply", "apply", "--spec", typo, expect=1)
    assert server_pid() == pid and max_len() == 1024


def test_a_saved_plan_prints_a_generation_history_knows() -> None:
    b = spec("b", B)
    step("resume", "resume", "--spec", b, expect=0)
    saved = LAB / "switch-b.plan"
    step("b_plan_out", "plan", "--out", str(saved), "--spec", b, expect=2)
    out = step("b_apply_file", "apply", str(saved), expect=2)
    last = out.rstrip().splitlines()[-1]
    assert ", generation 2" in last, out
    assert max_len() == 512 and marked(b) == 2
