"""`reconcile apply` when things go wrong, for real: a change that fails blocks only what depends on it
(exit 4), a preflight error changes nothing (exit 1), and a saved plan runs exactly as planned or,
when the machine moved since, not at all (exit 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in, seed_venv, tree_state


@pytest.fixture
def demo(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo with its venv (and ninja) in place: a copy of one made by a real apply."""
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def results(run_json: dict[str, Any]) -> dict[str, str]:
    return {r["resource"]: r["result"] for r in run_json["results"]}


def test_a_package_missing_from_the_index_blocks_the_server_while_model_and_key_still_apply(
    demo: Demo,
) -> None:
    def impossible_package(doc: Any) -> None:
        doc["venv"]["packages"]["reconcile-no-such-package"] = "*"

    demo.write_spec(impossible_package)
    run = demo.cli("apply", "--json")
    assert run.returncode == 4, run.output
    data = run.json()
    assert results(data) == {
        "venv.packages": "failed",
        "model.files": "changed",
        "model.config": "changed",
        "api_key": "changed",
        "server": "blocked",
    }
    failed = next(r for r in data["results"] if r["resource"] == "venv.packages")
    assert "reconcile-no-such-package" in failed["message"]
    blocked = next(r for r in data["results"] if r["resource"] == "server")
    assert blocked["message"] == "venv.packages failed"
    assert not data["converged"]
    assert demo.server_pids() == [] and not demo.pidfile.exists()
    assert json.loads((demo.model_dir / "config.json").read_text())["rope_parameters"]
    assert demo.key_file.stat().st_mode & 0o777 == 0o600
    (generation,) = demo.generations()  # something changed: recorded, failure included
    assert {c["resource"]: c["result"] for c in generation["changes"]}["venv.packages"] == "failed"
    assert generation["converged"] is False

    demo.write_spec()  # the fix: drop the package
    fixed = demo.cli("apply", "--json")
    assert fixed.returncode == 2, fixed.output
    assert results(fixed.json()) == {"server": "changed"}


def test_a_missing_model_source_is_refused_before_anything_changes(demo: Demo) -> None:
    """Issue 26 item 5: what cannot start is refused by the plan before anything is touched (before
    issue 26 the key was made and the model and server failed one by one, after the apply began)."""

    def no_source(doc: Any) -> None:
        doc["model"]["source"] = str(demo.root / "no-such-model")

    demo.write_spec(no_source)
    run = demo.cli("apply", "--json")
    assert run.returncode == 1, run.output
    data = run.json()
    assert data["refused"] and data["results"] == [] and not data["changed"]
    assert data["error"]["rule"] == "start.missing" and "no-such-model" in data["error"]["message"]
    assert not demo.key_file.exists() and not (demo.model_dir / "config.json").exists()
    assert demo.server_pids() == []


def test_a_preflight_error_exits_1_and_changes_nothing(demo: Demo) -> None:
    def too_long(doc: Any) -> None:
        doc["server"]["args"]["max-model-len"] = 100000

    demo.write_spec(too_long)
    before = tree_state(demo.root, set())
    run = demo.cli("apply")
    assert run.returncode == 1, run.output
    assert "apply refused: 1 preflight error(s); nothing was changed" in run.stdout
    assert "max-model-len" in run.stdout
    after = tree_state(demo.root, set())
    # New: the lock (emptied on release), the record of this run and its conditions; nothing else moved.
    new = {"state", "state/apply.lock", "state/last-run.json", "state/conditions.json"}
    assert set(after) - set(before) == new
    assert {k: v for k, v in after.items() if k in before} == before
    assert demo.lock_file.read_bytes() == b""
    assert json.loads(demo.last_run.read_text())["exit_code"] == 1
    assert demo.generations() == [] and demo.server_pids() == []


def test_a_bad_spec_exits_1_with_one_line_and_touches_nothing(demo: Demo) -> None:
    def bad_port(doc: Any) -> None:
        doc["server"]["port"] = "eighteen-thousand"

    demo.write_spec(bad_port)
    before = tree_state(demo.root, set())
    run = demo.cli("apply")
    assert run.returncode == 1, run.output
    (line,) = run.stderr.splitlines()
    assert "demo.toml:" in line and "server.port" in line and "Traceback" not in run.output
    assert tree_state(demo.root, set()) == before


def test_a_saved_plan_refuses_to_run_when_the_key_file_appeared_since(demo: Demo) -> None:
    plan_file = demo.root / "plan.json"
    planned = demo.cli("plan", "--out", str(plan_file))
    assert planned.returncode == 2
    assert "api_key" in [c["resource"] for c in json.loads(plan_file.read_text())["changes"]]
    demo.key_file.write_text("sk-made-by-someone-else\n")
    demo.key_file.chmod(0o600)

    run = demo.cli("apply", str(plan_file))
    assert run.returncode == 1, run.output
    assert "the machine changed (api_key: planned +, now already true" in run.stdout
    assert "nothing was changed" in run.stdout
    assert not demo.model_dir.exists() and demo.generations() == [] and demo.server_pids() == []
    assert demo.key_file.read_text() == "sk-made-by-someone-else\n"


def test_a_saved_plan_refuses_to_run_when_the_spec_changed_since(demo: Demo) -> None:
    plan_file = demo.root / "plan.json"
    assert demo.cli("plan", "--out", str(plan_file)).returncode == 2

    def more_seqs(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = 8

    demo.write_spec(more_seqs)
    run = demo.cli("apply", str(plan_file))
    assert run.returncode == 1, run.output
    assert "the spec changed since the plan file was made" in run.stdout
    assert not demo.model_dir.exists() and not demo.key_file.exists()


def test_a_saved_plan_runs_exactly_its_changes_when_nothing_moved(demo: Demo) -> None:
    plan_file = demo.root / "plan.json"
    assert demo.cli("plan", "--out", str(plan_file)).returncode == 2
    planned = [(c["resource"], c["kind"]) for c in json.loads(plan_file.read_text())["changes"]]
    assert planned == [("model.files", "+"), ("model.config", "~"), ("api_key", "+"), ("server", "+")]

    run = demo.cli("apply", str(plan_file), "--json")
    assert run.returncode == 2, run.output
    data = run.json()
    assert [(r["resource"], r["kind"], r["result"]) for r in data["results"]] == [
        (resource, kind, "changed") for resource, kind in planned
    ]
    assert data["converged"] and demo.cli("plan").returncode == 0

    again = demo.cli("apply", str(plan_file))  # done: the plan no longer describes the machine
    assert again.returncode == 1 and "now already true" in again.stdout
