"""`reconcile status`: writes nothing, shows a pause and the crash-loop guard's hold, and reads the
server's own /metrics (the fake serves them in Prometheus text as vLLM does); its JSON matches
schemas/status.schema.json."""

from __future__ import annotations

import json
import time
from typing import Any

import tomlkit

from tests.apply_support import Demo, tree_state
from tests.test_json_schemas import check


def test_status_of_a_machine_never_applied_creates_nothing(demo: Demo) -> None:
    run = demo.cli("status")
    assert run.returncode == 2, run.output  # drift: nothing applied yet
    assert not demo.state_dir.exists()  # before: status created <state_dir>/conditions.json
    assert demo.cli("status", "--json").returncode == 2
    assert not demo.state_dir.exists()


def test_status_of_a_serving_machine_shows_pause_load_and_matches_its_schema(seeded: Demo) -> None:
    def loaded_server(doc: Any) -> None:
        env = tomlkit.inline_table()
        env.update({**dict(doc["server"]["env"]), "FAKE_VLLM_KV_CACHE_USAGE": "0.25"})
        doc["server"]["env"] = env

    seeded.write_spec(loaded_server)
    assert seeded.cli("apply").returncode == 2
    assert seeded.cli("pause", "--reason", "KV cache tuning").returncode == 0
    before = tree_state(seeded.root, set())
    text = seeded.cli("status")
    assert text.returncode == 0, text.output
    assert "‖ paused by " in text.stdout and ": KV cache tuning (`reconcile resume` ends it)" in text.stdout
    assert "load: 0 running, 0 waiting; KV cache 25.0% used; generating 0.0 tokens/s" in text.stdout
    data = seeded.cli("status", "--json").json()
    check("status", data)
    assert data["pause"]["reason"] == "KV cache tuning" and data["hold"] is None
    assert data["server"]["metrics"]["kv_cache_usage"] == 0.25
    assert data["spec_sha256"] and data["host"] and data["git"]
    assert {c["resource"] for c in data["conditions"]} >= {"server", "api_key"}
    after = tree_state(seeded.root, {seeded.log})  # the server's own log grows; nothing else moves
    assert {k: v for k, v in after.items() if k != "demo.log"} == {
        k: v for k, v in before.items() if k != "demo.log"
    }


def test_status_shows_the_crash_loop_guards_hold(demo: Demo) -> None:
    demo.state_dir.mkdir(parents=True)
    now = time.time()
    history = [{"outcome": "failed", "at": now - i, "reason": "exit 1 before /health"} for i in (3, 2, 1)]
    (demo.state_dir / f"server-{demo.name}.json").write_text(json.dumps({"history": history}))
    run = demo.cli("status")
    assert (
        f"‖ server {demo.name} failed to start 3 times within 600s (last: exit 1 before /health)"
        in run.stdout
    )
    assert "not starting it again before" in run.stdout
    assert demo.cli("status", "--json").json()["hold"].startswith(f"server {demo.name} failed to start 3")
