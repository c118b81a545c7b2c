"""Launching the (fake) vLLM for real: to healthy, restart only on a new identity, no key anywhere,
a failure report with the log and its known cause, the crash-loop guard, and a stop of the whole tree."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import launching, supervising
from actions import server as server_action
from actions.launching import LaunchInputs, desired_identity
from actions.supervising import ReadinessProgress
from probes import health, server
from reconcile.errors import ActionError, RetryableError
from reconcile.plan.records import Change
from tests.test_server_support import (
    Deployment,
    alive,
    children_of,
    deployment_in,
    lock_is_held,
    wait_for,
)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment_in(tmp_path)


INPUTS = LaunchInputs(packages={"vllm": "0.26.0"}, model_revision="abc123")


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [i.decode(errors="replace") for i in f.read().split(b"\0") if i]
    return dict(i.split("=", 1) for i in items if "=" in i)


def test_launch_reaches_healthy_with_the_identity_stamped_in_a_clean_env(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = deployment
    monkeypatch.setenv("SOMETHING_OF_OURS", "must-not-leak")
    spec = d.spec({"max-model-len": 1024})
    result = server_action.ensure_running(spec, INPUTS)
    assert result.changed and "healthy" in result.message
    seen = server.probe(spec)
    assert seen.server is not None and seen.pidfile.state == "ours" and seen.pidfile.pid == seen.server.pid
    assert seen.listener.state == "ours" and seen.listener.pid == seen.server.pid
    assert seen.running_identity == desired_identity(spec, INPUTS).digest
    assert [p.role for p in seen.processes] == ["server", "member"]
    env = environ(seen.server.pid)
    assert env["PATH"].startswith(f"{d.root}/venv/bin:{d.root}/cuda/bin:")
    assert env["CUDA_HOME"] == f"{d.root}/cuda" and env["VLLM_API_KEY"] == d.key
    assert env["RECONCILE_DEPLOYMENT"] == d.marker == f"{d.name}@{d.state_dir}"
    assert "SOMETHING_OF_OURS" not in env
    (engine,) = children_of(seen.server.pid)
    # Like vLLM's children (setproctitle), the engine's /proc environ no longer shows the marker it
    # inherited; it is ours by its session, which our launch created.
    assert "RECONCILE_DEPLOYMENT" not in environ(engine)
    assert os.getsid(engine) == seen.server.pid
    assert os.getsid(seen.server.pid) == seen.server.pid != os.getsid(0)  # its own session
    up = health.probe(spec)
    assert (up.state, up.served_names, up.max_model_len, up.version) == (
        "healthy",
        ("fake-model",),
        1024,
        "0.26.0",
    )


def test_apply_twice_restarts_nothing(deployment: Deployment) -> None:
    spec = deployment.spec({"max-model-len": 1024})
    server_action.ensure_running(spec, INPUTS)
    before = server.probe(spec).server
    again = server_action.ensure_running(spec, INPUTS)
    assert not again.changed and "same launch identity" in again.message
    after = server.probe(spec).server
    assert before is not None and after is not None
    assert (after.pid, after.create_time) == (before.pid, before.create_time)


def test_changing_one_arg_restarts_once_and_says_why(deployment: Deployment) -> None:
    d = deployment
    server_action.ensure_running(d.spec({"max-model-len": 1024}), INPUTS)
    old = server.probe(d.spec()).server
    assert old is not None
    spec = d.spec({"max-model-len": 2048})
    result = server_action.apply(Change("server", "±", "restart", "args changed"), spec, INPUTS)
    assert result.changed and "args changed: --max-model-len 1024 -> 2048" in result.message
    assert not alive(old.pid)
    new = server.probe(spec)
    assert new.server is not None and new.server.pid != old.pid and not new.strays
    assert health.probe(spec).max_model_len == 2048
    assert not server_action.ensure_running(spec, INPUTS).changed


def test_a_new_config_json_restarts_the_server(deployment: Deployment) -> None:
    spec = deployment.spec()
    server_action.ensure_running(spec, LaunchInputs(config_json=b'{"a": 1}'))
    result = server_action.ensure_running(spec, LaunchInputs(config_json=b'{"a": 2}'))
    assert result.changed and "config.json changed" in result.message


def test_the_key_is_in_no_command_line_log_or_state_file(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec({"enable-auto-tool-choice": True, "tool-call-parser": "hermes"})
    server_action.ensure_running(spec, INPUTS)
    health.probe(spec)
    key = d.key.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    assert key not in f.read(), f"pid {entry} has the key on its command line"
            except OSError:
                continue
    assert d.key not in d.log_text()
    for directory, _, files in os.walk(d.state_dir):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                assert key not in f.read(), name
    assert d.key not in repr(server.probe(spec)) + repr(health.probe(spec))


def test_a_failed_start_reports_the_log_tail_and_the_known_cause(deployment: Deployment) -> None:
    d = deployment
    line = "RuntimeError: FlashInfer requires GPUs with sm75 or higher"
    spec = d.spec(env={"FAKE_VLLM_FAIL_WITH": line})
    with pytest.raises(server_action.ServerStartError) as caught:
        server_action.ensure_running(spec, INPUTS)
    failure = caught.value.failure
    assert failure.reason.startswith("the server exited with status 1")
    assert any(line in tail for tail in failure.log_tail)
    assert any("nvcc" in diagnosis for diagnosis in failure.diagnoses)
    assert d.key not in str(caught.value)
    assert not supervising.marked_pids(d.marker)  # nothing of the failed start is left running
    record = json.loads((d.state_dir / f"server-{d.name}.json").read_text())
    assert record["history"][-1]["outcome"] == "failed"


def test_a_removed_flag_fails_at_once_with_its_fix(deployment: Deployment) -> None:
    spec = deployment.spec({"swap-space": 4})
    with pytest.raises(server_action.ServerStartError) as caught:
        server_action.ensure_running(spec, INPUTS)
    assert caught.value.failure.reason.startswith("the server exited with status 2")
    assert any("drop args.swap-space" in diagnosis for diagnosis in caught.value.failure.diagnoses)


def test_crash_loop_guard_refuses_a_third_start_until_reset(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec({"swap-space": 4}, crash_loop={"max_starts": 2, "window": "10m"})
    for _ in range(2):
        with pytest.raises(server_action.ServerStartError):
            server_action.ensure_running(spec, INPUTS)
    with pytest.raises(ActionError, match="failed to start 2 times") as caught:
        server_action.ensure_running(spec, INPUTS)
    assert not isinstance(caught.value, server_action.ServerStartError)
    assert d.log_text().count("--- reconcile") == 2  # the refused start launched nothing
    assert launching.reset_crash_loop(spec).changed
    good = d.spec()
    assert server_action.ensure_running(good, INPUTS).changed


def test_progress_reports_elapsed_time_and_the_logs_last_line(deployment: Deployment) -> None:
    seen: list[ReadinessProgress] = []
    spec = deployment.spec(env={"FAKE_VLLM_STARTUP_DELAY": "1.0"})
    server_action.ensure_running(spec, INPUTS, progress=seen.append)
    assert len(seen) >= 2 and seen[-1].elapsed > seen[0].elapsed
    assert any("INFO" in p.last_line for p in seen)


def test_stop_ends_the_whole_tree_and_frees_the_gpus(deployment: Deployment) -> None:
    d = deployment
    spec = d.spec({"tensor-parallel-size": 2})
    server_action.ensure_running(spec, INPUTS)
    pids = [p.pid for p in server.probe(spec).processes]
    assert len(pids) == 4  # API server, EngineCore, Worker_TP0, Worker_TP1
    stopped = d.spec({"tensor-parallel-size": 2}, running=False)
    result = server_action.apply(Change("server", "-", "stop", "running = false"), stopped, INPUTS)
    assert result.changed and "stopped 4 process(es)" in result.message
    assert not any(alive(p) for p in pids)
    assert not lock_is_held(d.hold / "cuda0.lock") and not lock_is_held(d.hold / "cuda1.lock")
    assert server.probe(spec).pidfile.state == "absent"
    again = server_action.ensure_stopped(spec)
    assert not again.changed and "not running" in again.message


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(deployment: Deployment) -> None:
    spec = deployment.spec(env={"FAKE_VLLM_TERM_HANG": "1"}, stop_timeout=0.5)
    server_action.ensure_running(spec, INPUTS)
    pids = [p.pid for p in server.probe(spec).processes]
    outcome = supervising.stop_marked(deployment.marker, timeout=0.5)
    assert sorted(outcome.killed) == sorted(pids)
    assert not any(alive(p) for p in pids)


def test_stop_waits_until_nvml_no_longer_lists_the_pids(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes.fake_nvml import GIB, FakeProcess, h200

    spec = deployment.spec()
    server_action.ensure_running(spec, INPUTS)
    engine = next(p.pid for p in server.probe(spec).processes if p.role == "member")
    nvml = h200(processes=[FakeProcess(engine, int(14.8 * GIB))])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    threading.Timer(0.6, nvml.gpus[0].processes.clear).start()  # the driver frees it a moment later
    outcome = supervising.stop_marked(deployment.marker, timeout=2, gpu_budget=5)
    assert outcome.gpu == "NVML: none of them holds GPU memory"
    server_action.ensure_running(spec, INPUTS)
    engine = next(p.pid for p in server.probe(spec).processes if p.role == "member")
    nvml.gpus[0].processes.append(FakeProcess(engine, int(14.8 * GIB)))  # never released
    with pytest.raises(RetryableError, match=f"pid\\(s\\) {engine} still hold GPU memory"):
        supervising.stop_marked(deployment.marker, timeout=2, gpu_budget=0.5)


def _interrupt(_: ReadinessProgress) -> None:
    raise KeyboardInterrupt  # an apply stopped (Ctrl-C, timer killed) while the server was loading


def test_a_server_still_loading_is_waited_for_not_restarted(deployment: Deployment) -> None:
    spec = deployment.spec(env={"FAKE_VLLM_STARTUP_DELAY": "1.5"})
    with pytest.raises(KeyboardInterrupt):
        server_action.ensure_running(spec, INPUTS, progress=_interrupt)
    loading = server.probe(spec).server
    assert loading is not None and health.probe(spec).state == "not_listening"
    result = server_action.ensure_running(spec, INPUTS)
    assert result.changed and result.message == f"{deployment.name} (pid {loading.pid}) finished starting"
    assert health.probe(spec).state == "healthy"


def test_a_server_silent_past_startup_timeout_is_restarted(deployment: Deployment) -> None:
    spec = deployment.spec(env={"FAKE_VLLM_STARTUP_DELAY": "60"}, startup_timeout=1)
    with pytest.raises(KeyboardInterrupt):
        server_action.ensure_running(spec, INPUTS, progress=_interrupt)
    hung = server.probe(spec).server
    assert hung is not None
    wait_for(lambda: supervising.process_age(hung.pid) > 1.2, 5, "startup_timeout to pass")
    with pytest.raises(server_action.ServerStartError, match="did not answer 200 within 1s"):
        server_action.ensure_running(spec, INPUTS)
    assert not alive(hung.pid)
    assert "no answer on /health" in deployment.log_text()  # the restart said why


def test_progress_renders_live_on_a_terminal_and_as_sparse_lines_elsewhere() -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty, os.fdopen(os.open(os.devnull, os.O_WRONLY), "w") as plain:
        render = supervising.tty_progress(tty)
        assert render is not None and supervising.tty_progress(plain) is None
        render(ReadinessProgress(12.4, "(EngineCore_DP0 pid=7) ninja [12/56] building"))
    shown = os.read(master, 4096).decode()
    os.close(master)
    assert shown.startswith("\r  waiting for /health     12s  (EngineCore_DP0 pid=7) ninja [12/56]")
    lines: list[str] = []
    emit = supervising.line_progress(lines.append, every=10)
    for t in (0.0, 3.0, 9.9, 10.0, 25.0):
        emit(ReadinessProgress(t, "x"))
    assert [line.split(":")[1].strip() for line in lines] == ["0s; log", "10s; log", "25s; log"]


def test_a_running_server_whose_pidfile_was_lost_is_adopted_not_restarted(deployment: Deployment) -> None:
    spec = deployment.spec()
    server_action.ensure_running(spec, INPUTS)
    before = server.probe(spec).server
    assert before is not None
    (deployment.state_dir / f"{deployment.name}.pid").unlink()  # an apply killed before its rename
    assert server.probe(spec).pidfile.state == "absent" and server.probe(spec).server == before
    adopted = server_action.ensure_running(spec, INPUTS)
    assert adopted.changed and f"pidfile and record rewritten for pid {before.pid}" in adopted.message
    seen = server.probe(spec)
    assert seen.pidfile.state == "ours" and seen.server == before
    assert not server_action.ensure_running(spec, INPUTS).changed
