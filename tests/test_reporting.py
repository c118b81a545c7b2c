"""last-run.json and the Prometheus textfile, written by real plan/apply runs and read back by
json and by prometheus_client's own text parser."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconcile.apply.lock import apply_lock
from reconcile.cli import main
from reconcile.plan.records import Change, Ok, Plan
from reconcile.unattended import report as reporting
from reconcile.unattended.metrics import render_textfile as metrics_text


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def write_spec(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "box.toml"
    state, key = json.dumps(str(root / "state")), json.dumps(str(root / "api.key"))  # TOML basic strings
    spec.write_text(f"[machine]\nstate_dir = {state}\n\n[api_key]\nfile = {key}\n")
    return spec


def metrics(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the textfile, parsed by prometheus_client: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(path: Path) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(path.read_text())}


def last_run(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "state" / "last-run.json").read_text())
    return data


def test_apply_reports_what_it_found_changed_and_that_it_converged(tmp_path: Path) -> None:
    # A quote and a backslash in the path: label values must be escaped to parse back.
    root = tmp_path / 'odd "dir" \\ here'
    spec, prom = write_spec(root), tmp_path / "textfile" / "reconcile.prom"

    assert main(["apply", "--spec", str(spec), "--textfile", str(prom)]) == 2

    run = last_run(root)
    assert run["command"] == "apply" and run["outcome"] == "changed" and run["exit_code"] == 2
    assert run["converged"] is True and run["pending"] == []
    assert [(r["resource"], r["status"]) for r in run["found"]] == [("api_key", "change")]
    assert [(r["resource"], r["result"]) for r in run["results"]] == [("api_key", "changed")]
    assert run["duration_seconds"] >= run["results"][0]["seconds"] >= 0
    # Where the run's time went, by phase (reconcile.apply.phases), in the order they ran.
    ran = list(run["phases"])
    assert ran[ran.index("load") :] == [
        "load", "setup", "lock", "prepare", "plan", "changes", "final plan", "journal", "judge", "record",
    ]  # fmt: skip
    assert run["phases"]["changes"] >= run["results"][0]["seconds"]
    assert run["generation"] == 1 and run["spec"] == str(spec)
    m = metrics(prom)
    assert m[("reconcile_converged", ())] == 1
    assert m[("reconcile_last_run_changes", (("result", "changed"),))] == 1
    assert m[("reconcile_changes_total", (("result", "changed"),))] == 1
    assert m[("reconcile_runs_total", (("outcome", "changed"),))] == 1
    assert m[("reconcile_paused", ())] == 0 and m[("reconcile_last_run_success", ())] == 1
    assert abs(m[("reconcile_last_run_timestamp_seconds", ())] - run["timestamp"]) < 0.01
    assert (
        "reconcile_last_run_info",
        (("command", "apply"), ("git", "not in git"), ("spec", str(spec))),
    ) in m
    types = families(prom)
    assert types["reconcile_changes"] == "counter" and types["reconcile_converged"] == "gauge"
    assert ("reconcile_server_healthy", ()) not in m  # no [server] in this spec


def test_counters_carry_on_across_runs_and_gauges_describe_the_last(tmp_path: Path) -> None:
    spec, prom = write_spec(tmp_path), tmp_path / "reconcile.prom"
    assert main(["apply", "--spec", str(spec), "--textfile", str(prom)]) == 2

    assert main(["apply", "--spec", str(spec), "--textfile", str(prom)]) == 0
    assert main(["plan", "--spec", str(spec), "--textfile", str(prom)]) == 0

    m = metrics(prom)
    assert m[("reconcile_changes_total", (("result", "changed"),))] == 1
    assert m[("reconcile_last_run_changes", (("result", "changed"),))] == 0
    assert m[("reconcile_runs_total", (("outcome", "changed"),))] == 1
    assert m[("reconcile_runs_total", (("outcome", "converged"),))] == 2
    assert last_run(tmp_path)["command"] == "plan"


def test_the_textfile_is_replaced_whole_never_rewritten_in_place(tmp_path: Path) -> None:
    spec, prom = write_spec(tmp_path), tmp_path / "tf" / "reconcile.prom"
    assert main(["plan", "--spec", str(spec), "--textfile", str(prom)]) == 2
    with open(prom) as reader:  # a node_exporter scrape that opened the old file
        before = reader.read()
        inode = os.fstat(reader.fileno()).st_ino

        assert main(["apply", "--spec", str(spec), "--textfile", str(prom)]) == 2

        reader.seek(0)
        assert reader.read() == before  # the old file, whole, for whoever still reads it
    assert prom.stat().st_ino != inode
    assert os.listdir(prom.parent) == ["reconcile.prom"]  # no temp file left for the collector
    assert metrics(prom)[("reconcile_converged", ())] == 1


def test_a_spec_that_does_not_load_still_marks_the_textfile_failed(tmp_path: Path) -> None:
    spec, prom = write_spec(tmp_path), tmp_path / "reconcile.prom"
    assert main(["apply", "--spec", str(spec), "--textfile", str(prom)]) == 2
    spec.write_text(spec.read_text() + "\n[api_key.oops]\n")

    assert main(["apply", "--scheduled", "--spec", str(spec), "--textfile", str(prom)]) == 1

    m = metrics(prom)
    assert m[("reconcile_last_run_success", ())] == 0 and m[("reconcile_last_run_exit_code", ())] == 1
    assert m[("reconcile_runs_total", (("outcome", "error"),))] == 1
    assert m[("reconcile_runs_total", (("outcome", "changed"),))] == 1  # carried from the last textfile
    assert m[("reconcile_changes_total", (("result", "changed"),))] == 1
    assert (
        m[("reconcile_last_success_timestamp_seconds", ())] < m[("reconcile_last_run_timestamp_seconds", ())]
    )


def test_an_apply_that_cannot_get_the_lock_is_reported_as_an_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    with apply_lock(str(tmp_path / "state"), timeout=1):
        assert main(["apply", "--spec", str(spec), "--lock-timeout", "0.2"]) == 1

    run = last_run(tmp_path)
    assert run["outcome"] == "error" and "holds the lock" in run["error"]
    assert run["converged"] is False and run["failures"] == 1
    assert not (tmp_path / "api.key").exists()


def test_quiet_is_one_line_when_converged_and_the_whole_plan_when_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    assert main(["plan", "--quiet", "--spec", str(spec)]) == 2
    assert "+ api_key" in capsys.readouterr().out

    assert main(["apply", "--quiet", "--spec", str(spec)]) == 2
    capsys.readouterr()
    assert main(["apply", "--quiet", "--spec", str(spec)]) == 0

    assert capsys.readouterr().out == f"reconcile: {spec}: converged, nothing to do\n"


def test_server_health_and_pending_changes_come_from_the_last_plan() -> None:
    health = {"state": "unhealthy", "health_status": 503}
    plan = Plan(
        "box.toml",
        "h",
        "0" * 64,
        "git abc",
        (Ok("venv", "ok"), Change("server", "±", "restart", "sick")),
        observed={"health": health},
    )
    facts = reporting.RunFacts("plan", True, 100.0, 101.5, 2, "box.toml", plan=plan, server_wanted=True)

    record = reporting.build_record(facts, None)
    text = metrics_text(record)

    samples = {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels
    }
    assert samples["reconcile_server_healthy"] == 0 and samples["reconcile_pending_changes"] == 1
    assert samples["reconcile_last_run_duration_seconds"] == 1.5 and samples["reconcile_converged"] == 0
    assert record["outcome"] == "drift"
    healthy = reporting.build_record(
        reporting.RunFacts(
            "plan",
            True,
            100.0,
            101.0,
            0,
            "box.toml",
            plan=Plan("box.toml", "h", "0" * 64, "g", (), observed={"health": {"state": "healthy"}}),
            server_wanted=True,
        ),
        record,
    )
    assert healthy["server_healthy"] is True and healthy["counters"]["runs_total"]["drift"] == 1
