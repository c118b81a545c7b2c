"""Issue 29, item 4 on a real GPU with real vLLM 0.26.0: the real `VLLM::EngineCore` stopped with SIGSTOP
leaves /health answering 200 while a completion gets no answer; the next scheduled apply sees the
engine make no progress (a 1-token completion past its deadline, vLLM's generated-token counter still)
and restarts the server, which then answers.

Skipped unless RECONCILE_GPU_LAB=1. Run alone on the lab machine by
`GPU_LAB_TESTS=tests/test_gpu_lab_liveness.py tools/gpu_lab.sh` (about 3-4 minutes: two starts of the
tiny model and two 10 s deadlines); it brings the lab spec up itself. Figures are printed and written
to $OUT/gpu-lab-liveness.json when $OUT is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_gpu_lab import (
    GPU_LAB_MARKS,
    LAB,
    cli,
    dump_figures,
    get,
    gpu_pids,
    key,
    plan_json,
    server_pid,
    starts_in_log,
    variant,
)

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
# One look decides here (window <= deadline); the spec's defaults (15 s, 60 s) take two scheduled applies.
LIVENESS = '\nname = "tiny"\nliveness = { deadline = "10s", window = "5s" }'


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-liveness.json")
    cli("apply", "--spec", variant("liveness-stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def chat(max_tokens: int, timeout: float) -> tuple[int | None, float]:
    """(HTTP status or None when no answer came within `timeout`, seconds waited)."""
    import http.client

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": max_tokens,
    }
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Authorization": f"Bearer {key()}", "Content-Type": "application/json"},
        )
        status = conn.getresponse().status
    except TimeoutError:
        status = None
    finally:
        conn.close()
    return status, round(time.monotonic() - started, 2)


def engine_core_of(data: dict[str, Any], server: int) -> int:
    """The server's EngineCore among the deployment's processes (cgroup or recorded launches) that the
    plan observed: its parent is the pidfile's server, its title vLLM's. Never by name alone."""
    found = [
        p["pid"]
        for p in data["observed"]["server"]["processes"]
        if p["ppid"] == server and p["name"].startswith("VLLM::EngineCor")
    ]
    assert len(found) == 1, data["observed"]["server"]["processes"]
    return int(found[0])


def generated_tokens() -> float:
    import http.client

    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:generation_tokens_total"
    )


def test_a_stopped_engine_core_is_restarted_by_the_next_scheduled_apply() -> None:
    spec = variant("liveness", {'\nname = "tiny"': LIVENESS})
    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["first_apply_s"] = round(took, 1)
    assert code in (0, 2)
    data = plan_json(spec)
    assert data["_code"] == 0, data
    FIGURES["live_look"] = data["observed"]["liveness"]
    assert data["observed"]["liveness"]["answered"] is True
    FIGURES["plan_with_live_engine_s"] = round(data["_took"], 2)
    server = server_pid()
    assert server is not None
    engine = engine_core_of(data, server)
    FIGURES["engine_gpu_gib_before"] = round(gpu_pids().get(engine, 0) / 2**30, 2)
    starts = starts_in_log()

    os.kill(engine, signal.SIGSTOP)
    try:
        time.sleep(1)
        FIGURES["health_while_stopped"] = [get("/health", with_key=False)[0] for _ in range(5)]
        assert FIGURES["health_while_stopped"] == [200] * 5
        before = generated_tokens()
        FIGURES["chat_16_tokens_while_stopped"] = chat(16, timeout=15)
        assert FIGURES["chat_16_tokens_while_stopped"][0] is None  # no answer in 15 s
        assert generated_tokens() == before
        FIGURES["health_15s_later"] = get("/health", with_key=False)[0]
        assert FIGURES["health_15s_later"] == 200

        code, out, _err, took = cli("plan", "--spec", spec)
        FIGURES["plan_hung_s"] = round(took, 1)
        FIGURES["plan_line"] = next((x.strip() for x in out.splitlines() if "engine hung" in x), None)
        assert code == 2 and FIGURES["plan_line"], out
        code, out, _err, _took = cli("status", "--spec", spec)
        FIGURES["status_line"] = next((x.strip() for x in out.splitlines() if "engine:" in x), None)
        assert FIGURES["status_line"] and "engine: hung since" in FIGURES["status_line"], out

        code, out, _err, took = cli("apply", "--scheduled", "--spec", spec)
        FIGURES["scheduled_apply_detect_and_restart_s"] = round(took, 1)
        FIGURES["apply_line"] = next((x.strip() for x in out.splitlines() if "why: engine hung" in x), None)
        assert code == 2 and FIGURES["apply_line"], out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)  # a failed test leaves no stopped engine behind

    new = server_pid()
    assert new is not None and new != server and starts_in_log() == starts + 1
    left = gpu_pids()
    FIGURES["old_engine_on_gpu_after"] = engine in left
    assert engine not in left
    assert get("/health", with_key=False)[0] == 200
    FIGURES["chat_after_restart"] = chat(16, timeout=60)
    assert FIGURES["chat_after_restart"][0] == 200
    last = json.loads((LAB / "state" / "last-run.json").read_text())
    (result,) = [r for r in last["results"] if r["resource"] == "server"]
    assert result["result"] == "changed" and "engine hung since" in result["message"]
    code, _out, _err, _took = cli("apply", "--scheduled", "--spec", spec)
    assert code == 0 and server_pid() == new
