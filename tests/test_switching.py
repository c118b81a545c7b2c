"""One numbering, one truth (issue 26, items 4 and 5), on the CPU demo with real venvs from a local
wheelhouse and the fake vllm: every path that changes what serves records the generation `history`
and `diff` know; `*` is the generation serving; a failed switch goes back to the generation that was
serving; what cannot start is refused by the plan before anything is stopped; Ctrl-C or SIGTERM
during a switch is said, in the final line and in last-run.json."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import Demo, demo_in
from tests.generations_support import build_wheelhouse, server_cmdline, stored_spec


@pytest.fixture
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.getbasetemp())


@pytest.fixture
def two(tmp_path: Path, wheels: Path) -> Iterator[Demo]:
    """A demo with generations 1 (tinyserve 1.0) and 2 (2.0, more seqs), 2 serving."""
    for demo in demo_in(tmp_path):
        stored_spec(demo, wheels, "1.0")
        assert demo.cli("apply").returncode == 2
        stored_spec(demo, wheels, "2.0", args={"max-num-seqs": 8})
        second = demo.cli("apply")
        assert second.returncode == 2, second.output
        yield demo


def _current(demo: Demo) -> int:
    """The generation `history` marks with `*`."""
    history = demo.cli("history")
    assert history.returncode == 0, history.output
    marked = [line for line in history.stdout.splitlines() if line.startswith("*")]
    assert len(marked) == 1, history.stdout
    return int(marked[0][1:].split()[0])


def _final_generation(run_stdout: str) -> int:
    last = run_stdout.rstrip().splitlines()[-1]
    assert ", generation " in last, run_stdout
    return int(last.split(", generation ")[1].rstrip("."))


def test_apply_of_a_saved_plan_records_the_generation_that_history_and_diff_know(
    two: Demo, wheels: Path
) -> None:
    stored_spec(two, wheels, "2.0", args={"max-num-seqs": 6})
    saved = two.root / "saved.plan"
    assert two.cli("plan", "--out", str(saved)).returncode == 2
    run = two.cli("apply", str(saved))
    assert run.returncode == 2, run.output
    number = _final_generation(run.stdout)
    assert number == 3, run.stdout
    assert "--max-num-seqs 6" in server_cmdline(two)
    assert _current(two) == number
    diff = two.cli("diff", "2", str(number))
    assert diff.returncode == 0 and "args: --max-num-seqs 8 -> 6" in diff.stdout, diff.output


def test_history_marks_the_generation_serving_after_a_killed_apply_and_rollback_onto_it_holds(
    two: Demo, wheels: Path
) -> None:
    assert two.cli("rollback", "1", "--auto-approve").returncode == 2
    assert two.cli("resume").returncode == 0
    # Generation 2's spec again; killed after its server started, before anything was recorded.
    killed = two.cli("apply", kill_at="apply.executed")
    assert killed.returncode == -signal.SIGKILL, killed.output
    assert "--max-num-seqs 8" in server_cmdline(two)
    assert _current(two) == 2  # what serves, not the last record written
    starts = two.starts_in_log()

    back = two.cli("rollback", "2", "--auto-approve")
    assert back.returncode in (0, 2), back.output
    assert "rolled back to generation 2" in back.stdout, back.output
    assert two.starts_in_log() == starts  # it already served: nothing restarted
    assert _current(two) == 2
    plan = two.cli("plan")
    assert "held at generation 2 by rollback" in plan.stdout, plan.output
    index = json.loads((two.state_dir / "profile" / "index.json").read_text())
    assert index["current"] == 2 and index["hold"]["generation"] == 2


def test_a_failed_switch_rolls_back_to_the_generation_that_was_serving_not_the_newest_good(
    two: Demo, wheels: Path
) -> None:
    assert two.cli("rollback", "1", "--auto-approve").returncode == 2
    serving = two.server_environ("RECONCILE_IDENTITY")
    cmdline = server_cmdline(two)
    # A new spec (the hold ends) whose acceptance chat fails.
    stored_spec(two, wheels, "1.0", args={"max-num-seqs": 3}, env={"FAKE_VLLM_CHAT_FAIL": "1"})
    bad = two.cli("apply")
    assert bad.returncode == 4, bad.output
    assert "automatic rollback to generation 1:" in bad.stdout, bad.output
    assert two.server_environ("RECONCILE_IDENTITY") == serving
    assert server_cmdline(two) == cmdline and "--max-num-seqs 4" in cmdline
    assert _current(two) == 1


def test_a_typo_in_the_executable_is_refused_by_plan_and_the_server_keeps_running(
    two: Demo, wheels: Path
) -> None:
    assert two.cli("rollback", "1", "--auto-approve").returncode == 2
    serving = two.server_environ("RECONCILE_IDENTITY")
    pid = int(two.pidfile.read_text().split()[0])
    typo = str(two.root / "venv" / "bin" / "vlm")
    stored_spec(two, wheels, "1.0", server={"executable": typo})
    plan = two.cli("plan")
    assert plan.returncode == 1, plan.output
    assert f"[server].executable {typo}" in plan.output and "does not exist" in plan.output, plan.output
    apply = two.cli("apply")
    assert apply.returncode == 1, apply.output
    assert int(two.pidfile.read_text().split()[0]) == pid
    assert two.server_environ("RECONCILE_IDENTITY") == serving

    script = two.root / "not-executable"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    stored_spec(two, wheels, "1.0", server={"executable": str(script)})
    plan = two.cli("plan")
    assert plan.returncode == 1 and "is not executable" in plan.output, plan.output
    assert int(two.pidfile.read_text().split()[0]) == pid


def test_a_model_source_that_is_not_there_is_refused_by_plan(demo: Demo) -> None:
    missing = demo.root / "no-such-model"

    def edit(doc: object) -> None:
        doc["model"]["source"] = str(missing)  # type: ignore[index]

    demo.write_spec(edit)
    plan = demo.cli("plan")
    assert plan.returncode == 1, plan.output
    assert f"[model].source {missing}" in plan.output and "does not exist" in plan.output, plan.output


def test_a_venv_whose_wheelhouse_is_missing_and_that_has_no_index_is_refused_by_plan(
    two: Demo, wheels: Path
) -> None:
    pid = int(two.pidfile.read_text().split()[0])
    gone = two.root / "wheels-gone"
    stored_spec(two, wheels, "1.0")
    text = two.spec_path.read_text().replace(str(wheels), str(gone))
    two.spec_path.write_text(text)
    plan = two.cli("plan")
    assert plan.returncode == 1, plan.output
    assert f"[venv].wheelhouse {gone}" in plan.output and "no index" in plan.output, plan.output
    assert two.cli("apply").returncode == 1
    assert int(two.pidfile.read_text().split()[0]) == pid


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def _started_with(demo: Demo, flag: str, proc: object) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if flag in server_cmdline(demo):
                return
        except (OSError, ValueError, IndexError):
            pass
        assert proc.poll() is None, "apply ended before the new server started"  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the new server never started"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_switch_says_what_it_left_and_history_knows_it(
    two: Demo, wheels: Path, how: str
) -> None:
    stored_spec(two, wheels, "2.0", args={"max-num-seqs": 5}, env={"FAKE_VLLM_STARTUP_DELAY": "60"})
    proc = two.start("apply")
    _started_with(two, "--max-num-seqs 5", proc)
    time.sleep(0.3)  # inside the readiness wait
    if how == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole foreground group
    else:
        os.kill(proc.pid, signal.SIGTERM)  # systemd stopping the timer's apply
    run = two.finish(proc)
    assert run.returncode == 130, run.output
    last = run.stderr.rstrip().splitlines()[-1]
    assert "interrupted" in last and "generation 3" in last and "left starting" in last, run.output
    record = json.loads(two.last_run.read_text())
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130
    assert "generation 3" in record["error"] and "left starting" in record["error"], record
    assert "--max-num-seqs 5" in server_cmdline(two)
    assert _current(two) == 3
    assert stat.S_IMODE((two.state_dir / "last-run.json").stat().st_mode) == 0o600


def test_a_record_that_fails_its_index_check_is_listed_as_skipped_and_never_rolled_back_to(
    two: Demo,
) -> None:
    record = two.state_dir / "profile" / "1.json"
    record.write_text(record.read_text().replace('"reason": "apply"', '"reason": "apply (edited)"'))
    history = two.cli("history")
    assert history.returncode == 0, history.output
    assert f"   1  skipped: {record}: its sha256 is not the one reconcile recorded" in history.stdout
    assert _current(two) == 2
    back = two.cli("rollback", "1", "--auto-approve")
    assert back.returncode == 1 and "is not used" in back.stderr, back.output
    assert "--max-num-seqs 8" in server_cmdline(two)
