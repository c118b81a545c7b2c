"""`reconcile apply` of the CPU demo spec end to end, with real parts: a real venv and pip, real files,
the fake `vllm` as a real process tree on loopback. Converges, then changes nothing; records
generations only when something changed; history, diff and rollback on real generations; no key leaks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from reconcile.host import http_request
from tests.apply_support import DEMO_MODEL, Demo, cmdlines, tree_state


def models(demo: Demo, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http_request("GET", "127.0.0.1", demo.port, "/v1/models", headers=headers).status


def test_apply_from_nothing_converges_then_plan_and_a_second_apply_change_nothing(demo: Demo) -> None:
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    assert "Apply converged" in first.stdout and "generation 1" in first.stdout
    for resource in ("venv", "venv.packages", "model.files", "model.config", "api_key", "server"):
        assert f"{resource} " in first.stdout
    config = json.loads((demo.model_dir / "config.json").read_text())
    assert config["rope_parameters"]["factor"] == 2.0
    assert (demo.model_dir / "config.json.bak").read_bytes() == (DEMO_MODEL / "config.json").read_bytes()
    key = demo.key_file.read_text().strip()
    assert models(demo, key) == 200 and models(demo, None) == 401

    plan = demo.cli("plan")
    assert plan.returncode == 0, plan.output
    assert "No changes" in plan.stdout

    # Excluded from the mtime comparison: the server's log, which the running server itself writes
    # to; apply.lock, which every apply writes its holder record into and empties on release (its
    # content is checked instead: empty once released); last-run.json, the record of every run
    # (when, exit code) that monitoring reads, rewritten by design (checked: it says exit 0), and
    # so the state dir's own mtime (its rename lands there; the dir's entries are still compared).
    excluded = {demo.log, demo.lock_file, demo.last_run, demo.state_dir}
    before = tree_state(demo.root, excluded)
    pid = int(demo.pidfile.read_text())
    second = demo.cli("apply")
    assert second.returncode == 0, second.output
    assert "No changes" in second.stdout
    assert tree_state(demo.root, excluded) == before
    assert demo.lock_file.read_bytes() == b""
    assert json.loads(demo.last_run.read_text())["exit_code"] == 0
    assert len(demo.generations()) == 1
    assert int(demo.pidfile.read_text()) == pid and demo.starts_in_log() == 1


def test_apply_json_reports_each_change_and_only_a_changing_apply_writes_a_generation(seeded: Demo) -> None:
    first = seeded.cli("apply", "--json")
    assert first.returncode == 2, first.output
    data = first.json()
    assert set(data) == {
        "format",
        "spec",
        "spec_sha256",
        "host",
        "git",
        "exit_code",
        "changed",
        "refused",
        "converged",
        "error",
        "generation",
        "notes",
        "results",
        "final_plan",
        "seconds",
        "paused",
    }
    assert data["format"] == "reconcile-apply-json/1" and data["error"] is None
    assert (data["exit_code"], data["refused"], data["converged"], data["generation"]) == (2, None, True, 1)
    assert [r["resource"] for r in data["results"]] == ["model.files", "model.config", "api_key", "server"]
    for r in data["results"]:
        assert set(r) == {"resource", "kind", "summary", "result", "message", "seconds", "diffs"}
        assert r["result"] == "changed" and r["seconds"] >= 0
    assert data["final_plan"]["exit_code"] == 0
    assert all(r["status"] == "ok" for r in data["final_plan"]["resources"])

    again = seeded.cli("apply", "--json")
    assert again.returncode == 0, again.output
    data = again.json()
    assert (data["exit_code"], data["converged"], data["generation"], data["results"]) == (0, True, None, [])
    generations = seeded.generations()
    assert [g["generation"] for g in generations] == [1]
    recorded = generations[0]
    assert (recorded["complete"], recorded["converged"]) == (True, True)
    assert recorded["spec_text"] == seeded.spec_path.read_text()
    assert recorded["resolved"]["packages"]["ninja"]
    assert recorded["resolved"]["server_identity"] == seeded.server_environ("RECONCILE_IDENTITY")
    assert [c["resource"] for c in recorded["changes"]] == [
        "model.files",
        "model.config",
        "api_key",
        "server",
    ]


def test_a_config_patch_change_is_planned_as_a_restart_and_applied_with_one(seeded: Demo) -> None:
    assert seeded.cli("apply").returncode == 2

    def factor_3(doc: Any) -> None:
        doc["model"]["config"]["rope_parameters"]["factor"] = 3.0

    seeded.write_spec(factor_3)
    plan = seeded.cli("plan", "--json")
    assert plan.returncode == 2
    kinds = {r["resource"]: r.get("kind") for r in plan.json()["resources"]}
    assert kinds["model.config"] == "~" and kinds["server"] == "±"

    applied = seeded.cli("apply")
    assert applied.returncode == 2, applied.output
    assert seeded.starts_in_log() == 2
    assert json.loads((seeded.model_dir / "config.json").read_text())["rope_parameters"]["factor"] == 3.0
    assert seeded.cli("plan").returncode == 0


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_history_diff_and_rollback_on_real_generations_restart_the_server_once_each(seeded: Demo) -> None:
    spec_dir = seeded.spec_path.parent
    _git(spec_dir, "init", "-q")
    _git(spec_dir, "add", "demo.toml")
    _git(spec_dir, "commit", "-q", "-m", "demo")
    head = _git(spec_dir, "rev-parse", "HEAD")

    assert seeded.cli("apply").returncode == 2
    identity_1 = seeded.server_environ("RECONCILE_IDENTITY")
    assert seeded.starts_in_log() == 1

    def more_seqs(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = 8

    seeded.write_spec(more_seqs)
    changed = seeded.cli("apply")
    assert changed.returncode == 2, changed.output
    identity_2 = seeded.server_environ("RECONCILE_IDENTITY")
    assert identity_2 != identity_1 and seeded.starts_in_log() == 2

    g1, g2 = seeded.generations()
    assert (g1["git_commit"], g1["git_dirty"]) == (head, False)
    assert (g2["git_commit"], g2["git_dirty"]) == (head, True)
    assert g1["resolved"]["server_identity"] == identity_1 and g2["resolved"]["server_identity"] == identity_2
    assert [(c["resource"], c["result"]) for c in g2["changes"]] == [("server", "changed")]

    history = seeded.cli("history")
    assert history.returncode == 0
    numbered = [ln for ln in history.stdout.splitlines() if re.match(r"^[ *]\s*\d+\s", ln)]
    assert numbered[0].split()[0] == "1"
    assert len(numbered) == 2 and numbered[1].startswith("*  2") and "✓ served" in numbered[1]
    assert "args: --max-num-seqs 4 -> 8" in history.stdout

    diff = seeded.cli("diff", "1", "2")
    assert diff.returncode == 0
    assert "args: --max-num-seqs 4 -> 8" in diff.stdout and "packages" not in diff.stdout

    back = seeded.cli("rollback")  # the generation below the current one: 1
    assert back.returncode == 2, back.output
    assert "rolled back to generation 1" in back.stdout and "uncommitted" not in back.stdout
    assert seeded.server_environ("RECONCILE_IDENTITY") == identity_1
    assert seeded.starts_in_log() == 3
    g3 = seeded.generations()[2]  # the apply journal keeps what the rollback ran
    assert (g3["rollback_of"], g3["spec_sha256"]) == (1, g1["spec_sha256"])

    same = seeded.cli("rollback", "1")  # already there: the server keeps running
    assert same.returncode == 0, same.output
    assert seeded.starts_in_log() == 3 and len(seeded.generations()) == 3


def test_the_key_never_appears_in_output_state_files_our_log_lines_or_command_lines(seeded: Demo) -> None:
    for args in (("plan",), ("apply", "--json"), ("plan", "--json"), ("apply",), ("history",)):
        seeded.cli(*args)

    def longer(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = 6

    seeded.write_spec(longer)
    assert seeded.cli("apply").returncode == 2
    seeded.cli("diff", "1", "2")
    key = seeded.key_file.read_text().strip()
    assert len(key) >= 32 and models(seeded, key) == 200  # the key is the one in use

    for run in seeded.runs:
        assert key not in run.output, run.argv
    state_files = [p for p in seeded.state_dir.rglob("*") if p.is_file()]
    assert any(p.parent.name == "generations" for p in state_files)
    for path in state_files:
        assert key not in path.read_text(errors="replace"), path
    ours = [ln for ln in seeded.log.read_text().splitlines() if ln.startswith("--- reconcile")]
    assert len(ours) == 2 and all(key not in ln for ln in ours)
    assert all(key not in c for c in cmdlines())
