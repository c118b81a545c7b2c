"""The fake `vllm` behaves like the real one where reconcile depends on it (reference/vllm-facts.md)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.host import HttpUnreachable, http_request
from tests.test_server_support import (
    FAKE_VLLM,
    Deployment,
    alive,
    children_of,
    cmdline,
    deployment_in,
    free_port,
    lock_is_held,
    wait_for,
)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment_in(tmp_path)


def status(d: Deployment, path: str, key: str | None = None) -> int | None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return http_request("GET", "127.0.0.1", d.port, path, headers=headers, timeout=2).status
    except HttpUnreachable:
        return None


def get_json(d: Deployment, path: str, key: str | None = None) -> object:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http_request("GET", "127.0.0.1", d.port, path, headers=headers, timeout=2).json()


def chat(d: Deployment, body: dict[str, object], key: str) -> tuple[int, dict[str, object]]:
    resp = http_request(
        "POST",
        "127.0.0.1",
        d.port,
        "/v1/chat/completions",
        timeout=5,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        body=json.dumps(body).encode(),
    )
    data = resp.json()
    assert isinstance(data, dict)
    return resp.status, data


def serve(d: Deployment, *flags: str, **env: str) -> subprocess.Popen[bytes]:
    proc = d.run_fake(
        ["serve", str(d.model_dir), "--host", "127.0.0.1", "--port", str(d.port), *flags],
        {"VLLM_API_KEY": d.key, **env},
    )
    wait_for(lambda: status(d, "/health") == 200 or proc.poll() is not None, 10, "/health")
    assert proc.poll() is None, d.log_text()
    return proc


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FAKE_VLLM, *argv], env={**os.environ, **env}, capture_output=True, text=True, timeout=30
    )


def test_version_flag_prints_the_configured_version() -> None:
    assert run_cli("--version").stdout.strip() == "0.26.0"
    assert run_cli("--version", FAKE_VLLM_VERSION="0.11.0").stdout.strip() == "0.11.0"


@pytest.mark.parametrize(
    ("version", "flag", "value", "rc"),
    [
        ("0.26.0", "--swap-space", "4", 2),
        ("0.17.0", "--swap-space", "4", 1),
        ("0.11.1", "--rope-theta", "1000000", 2),
        ("0.11.0", "--rope-theta", "1000000", 1),
        ("0.11.0", "--reasoning-parser-plugin", "/m/p.py", 2),
        ("0.11.1", "--reasoning-parser-plugin", "/m/p.py", 1),
    ],
)
def test_flags_are_those_of_the_configured_release(version: str, flag: str, value: str, rc: int) -> None:
    # A model path that does not exist: rc 1 means the flags parsed and start-up went on to fail on it.
    done = run_cli("serve", "/nonexistent/model", flag, value, FAKE_VLLM_VERSION=version)
    assert done.returncode == rc, done.stderr
    if rc == 2:
        assert done.stderr.strip().endswith(f"vllm: error: unrecognized arguments: {flag} {value}")
    else:
        assert "Invalid repository ID or local directory" in done.stdout


@pytest.mark.parametrize(("version", "rc"), [("0.26.0", 2), ("0.17.0", 1)])
def test_without_the_reference_lists_flags_come_from_the_packaged_table(version: str, rc: int) -> None:
    done = run_cli(
        "serve",
        "/nonexistent/model",
        "--swap-space",
        "4",
        FAKE_VLLM_VERSION=version,
        FAKE_VLLM_FLAGS_DIR="/nonexistent",
    )
    assert done.returncode == rc, done.stderr


def test_max_model_len_above_the_derived_limit_fails_like_vllm(deployment: Deployment) -> None:
    done = run_cli("serve", str(deployment.model_dir), "--max-model-len", "8k", FAKE_VLLM_STARTUP_DELAY="0")
    assert done.returncode == 1
    assert "User-specified max_model_len (8000) is greater than the derived max_model_len" in done.stdout
    assert "max_position_embeddings=4096.0" in done.stdout


def test_port_refuses_until_the_model_is_loaded(deployment: Deployment) -> None:
    d = deployment
    started = time.monotonic()
    proc = d.run_fake(
        ["serve", str(d.model_dir), "--host", "127.0.0.1", "--port", str(d.port)],
        {"FAKE_VLLM_STARTUP_DELAY": "1.0"},
    )
    time.sleep(0.4)
    assert status(d, "/health") is None  # refused while loading
    wait_for(lambda: status(d, "/health") == 200, 10, "/health")
    assert time.monotonic() - started >= 1.0
    assert proc.poll() is None
    log = d.log_text()
    assert "GPU KV cache size: 4,194,304 tokens" in log
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{d.port}" in log
    assert log.index("Starting vLLM API server") < log.index("Application startup complete.")


def binds(port: int, reuse: bool) -> bool:
    """Whether a socket can bind the port on loopback now (closed at once), with SO_REUSEADDR or without."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return False
        return True


def test_the_port_is_bound_before_the_load_and_listened_on_after_it(deployment: Deployment) -> None:
    """vLLM 0.26.0's api_server.setup_server binds the port (SO_REUSEADDR) before it builds the engine,
    and uvicorn listens once the engine is up. While the model loads a connection is refused and a plain
    bind fails, but a bind with SO_REUSEADDR succeeds: the port is another user's to listen on first
    (round 9's attack, tests/test_hostile_reader9b.py). A port someone listens on fails the start at once."""
    d = deployment
    proc = d.run_fake(
        ["serve", str(d.model_dir), "--host", "127.0.0.1", "--port", str(d.port)],
        {"FAKE_VLLM_STARTUP_DELAY": "3.0"},
    )
    wait_for(lambda: not binds(d.port, reuse=False), 10, "the port bound")
    assert status(d, "/health") is None and binds(d.port, reuse=True)
    wait_for(lambda: status(d, "/health") == 200, 15, "/health")
    assert not binds(d.port, reuse=True)  # listened on: no one else's now
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", d.port))
        holder.listen()
        done = run_cli("serve", str(d.model_dir), "--host", "127.0.0.1", "--port", str(d.port),
                       FAKE_VLLM_STARTUP_DELAY="5")  # fmt: skip
    assert done.returncode == 1 and "OSError: [Errno 98] Address already in use" in done.stdout
    assert "Initializing a V1 LLM engine" not in done.stdout  # at once: before the engine, not after the load


def test_models_needs_the_key_from_the_environment_and_reports_max_model_len(deployment: Deployment) -> None:
    d = deployment
    (d.model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 1048576}))
    serve(d, "--served-model-name", "nano", "--max-model-len", "32k")
    assert status(d, "/v1/models") == 401
    assert status(d, "/v1/models", "wrong-key") == 401
    assert status(d, "/health") == 200 and status(d, "/version") == 200 and status(d, "/metrics") == 200
    assert get_json(d, "/version") == {"version": "0.26.0"}
    body = get_json(d, "/v1/models", d.key)
    assert isinstance(body, dict)
    assert [(c["id"], c["root"], c["max_model_len"], c["owned_by"]) for c in body["data"]] == [
        ("nano", str(d.model_dir), 32000, "vllm")
    ]
    assert d.key not in d.log_text()


@pytest.mark.parametrize(
    ("version", "fields"),
    [
        ("0.11.0", {"reasoning_content"}),
        ("0.13.0", {"reasoning", "reasoning_content"}),
        ("0.26.0", {"reasoning"}),
    ],
)
def test_reasoning_text_is_in_the_field_of_the_release(
    deployment: Deployment, version: str, fields: set[str]
) -> None:
    d = deployment
    serve(d, "--served-model-name", "m", "--reasoning-parser", "nano_v3", FAKE_VLLM_VERSION=version)
    code, data = chat(
        d, {"model": "m", "messages": [{"role": "user", "content": "Capital of France?"}]}, d.key
    )
    assert code == 200
    message = data["choices"][0]["message"]  # type: ignore[index]
    present = {f for f in ("reasoning", "reasoning_content") if f in message}
    assert present == fields
    assert all(message[f] for f in fields)
    assert "Paris" in message["content"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["location", "days"],
        },
    },
}


def test_forced_tool_choice_returns_a_tool_call_with_json_arguments(deployment: Deployment) -> None:
    """With a tool parser, a named choice is a call whose arguments are JSON; without one, vLLM 0.26.0
    answers 400 (as "auto" without --enable-auto-tool-choice); cut by max_tokens, it is no call."""
    d = deployment
    serve(d, "--served-model-name", "m", "--tool-call-parser", "hermes")
    body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Tokyo?"}], "tools": [WEATHER]}
    code, data = chat(
        d, {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, d.key
    )
    assert code == 200
    call = data["choices"][0]["message"]["tool_calls"][0]["function"]  # type: ignore[index]
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"location": "Tokyo", "days": 1}
    named = {"type": "function", "function": {"name": "get_weather"}}
    code, data = chat(d, {**body, "tool_choice": named, "max_tokens": 1}, d.key)
    choice = data["choices"][0]  # type: ignore[index]
    assert code == 200 and choice["finish_reason"] == "length" and choice["message"]["tool_calls"] == []
    code, data = chat(d, {**body, "tool_choice": "auto"}, d.key)
    assert code == 400 and "--enable-auto-tool-choice" in json.dumps(data)


def test_a_named_tool_choice_without_a_tool_parser_is_refused(deployment: Deployment) -> None:
    d = deployment
    serve(d, "--served-model-name", "m")
    body = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    code, data = chat(
        d, {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, d.key
    )
    assert code == 400, data
    assert (
        data["error"]["message"] == 'tool_choice=function "get_weather" requires --tool-call-parser to be set'
    )  # type: ignore[index]
    code, data = chat(d, {**body, "tool_choice": "required"}, d.key)
    assert code == 400 and "--tool-call-parser" in json.dumps(data), data


def test_sigkill_of_the_api_server_leaves_engine_core_holding_the_gpu(deployment: Deployment) -> None:
    d = deployment
    proc = serve(d)
    (engine,) = children_of(proc.pid)
    assert "VLLM::EngineCore" in cmdline(engine) and "vllm serve" not in cmdline(engine)
    assert os.getpgid(engine) == os.getpgid(proc.pid)  # vLLM never calls setsid
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)
    time.sleep(0.3)
    assert alive(engine)
    assert lock_is_held(d.hold / "cuda0.lock")
    assert (d.hold / "cuda0.lock").read_text().strip() == str(engine)
    # The next server cannot get the "GPU" memory while the orphan holds it.
    d2 = d.run_fake(["serve", str(d.model_dir), "--port", str(d.port)])
    assert d2.wait(10) == 1
    assert "Free memory on device cuda:0" in d.log_text()
    os.kill(engine, signal.SIGTERM)
    wait_for(lambda: not alive(engine), 5, "EngineCore to exit on SIGTERM")
    assert not lock_is_held(d.hold / "cuda0.lock")


def test_tensor_parallel_two_starts_engine_core_and_two_workers(deployment: Deployment) -> None:
    d = deployment
    proc = serve(d, "--tensor-parallel-size", "2")
    (engine,) = children_of(proc.pid)
    workers = children_of(engine)
    titles = sorted(cmdline(w).split("VLLM::")[1].split()[0] for w in workers)
    assert titles == ["Worker_TP0", "Worker_TP1"]
    with open(f"/proc/{workers[0]}/comm") as f:
        assert f.read().strip() == "VLLM::Worker_TP"  # setproctitle's title, cut to 15 bytes
    assert lock_is_held(d.hold / "cuda0.lock") and lock_is_held(d.hold / "cuda1.lock")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not any(alive(p) for p in [engine, *workers])
    assert not lock_is_held(d.hold / "cuda0.lock") and not lock_is_held(d.hold / "cuda1.lock")


def test_health_turns_503_when_the_engine_dies(deployment: Deployment) -> None:
    d = deployment
    proc = serve(d)
    (engine,) = children_of(proc.pid)
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: status(d, "/health") == 503, 5, "/health 503")
    assert proc.poll() is None


def test_engine_death_on_0_10_answers_500_and_exits(deployment: Deployment) -> None:
    d = deployment
    proc = serve(d, FAKE_VLLM_VERSION="0.10.2")
    (engine,) = children_of(proc.pid)
    os.kill(engine, signal.SIGKILL)
    assert proc.wait(10) == 0


def test_injected_failure_is_logged_and_exits_1_after_the_delay(deployment: Deployment) -> None:
    d = deployment
    line = "RuntimeError: FlashInfer requires GPUs with sm75 or higher"
    proc = d.run_fake(["serve", str(d.model_dir), "--port", str(d.port)], {"FAKE_VLLM_FAIL_WITH": line})
    assert proc.wait(10) == 1
    assert line in d.log_text()
    assert not lock_is_held(d.hold / "cuda0.lock")  # its engine was stopped too


def test_metrics_follow_the_release(deployment: Deployment) -> None:
    d = deployment
    serve(d, "--served-model-name", "m", FAKE_VLLM_VERSION="0.11.0")
    text = http_request("GET", "127.0.0.1", d.port, "/metrics").body.decode()
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 0.0' in text
    assert "vllm:gpu_cache_usage_perc" in text and "vllm:kv_cache_usage_perc" in text


def test_by_default_each_port_has_its_own_gpu_lock(deployment: Deployment) -> None:
    d = deployment
    other = free_port()
    env = {"FAKE_VLLM_HOLD": "", "TMPDIR": str(d.root)}  # the default place, under this test's temp dir
    first = serve(d, **env)
    second = d.run_fake(["serve", str(d.model_dir), "--host", "127.0.0.1", "--port", str(other)], env)
    wait_for(lambda: status_at(other, "/health") == 200 or second.poll() is not None, 10, "second /health")
    assert first.poll() is None and second.poll() is None, d.log_text()
    assert lock_is_held(d.root / f"fake-vllm-gpus-{d.port}" / "cuda0.lock")
    assert lock_is_held(d.root / f"fake-vllm-gpus-{other}" / "cuda0.lock")


def status_at(port: int, path: str) -> int | None:
    try:
        return http_request("GET", "127.0.0.1", port, path, timeout=2).status
    except HttpUnreachable:
        return None


def test_servers_share_a_gpu_by_their_gpu_memory_utilization_as_vllm_does(deployment: Deployment) -> None:
    """vLLM's worker refuses to start when less than gpu-memory-utilization x total is free: two at 0.4
    fit one GPU, a third at 0.4 does not (0.2 free), and says so in vLLM's words."""
    d = deployment
    first = serve(d, "--gpu-memory-utilization", "0.4")
    ports = [free_port(), free_port()]
    second = d.run_fake(
        ["serve", str(d.model_dir), "--port", str(ports[0]), "--gpu-memory-utilization", "0.4"],
        {"VLLM_API_KEY": d.key},
    )
    wait_for(
        lambda: status_at(ports[0], "/health") == 200 or second.poll() is not None, 10, "the second /health"
    )
    assert second.poll() is None and first.poll() is None, d.log_text()
    third = d.run_fake(
        ["serve", str(d.model_dir), "--port", str(ports[1]), "--gpu-memory-utilization", "0.4"],
        {"VLLM_API_KEY": d.key},
    )
    assert third.wait(10) == 1
    assert (
        "Free memory on device cuda:0 (28.0/139.8 GiB) on startup is less than desired GPU memory "
        "utilization (0.4, 55.9 GiB)" in d.log_text()
    )
    second.send_signal(signal.SIGTERM)
    assert second.wait(10) == 0
    again = d.run_fake(
        ["serve", str(d.model_dir), "--port", str(ports[1]), "--gpu-memory-utilization", "0.4"],
        {"VLLM_API_KEY": d.key},
    )
    wait_for(
        lambda: status_at(ports[1], "/health") == 200 or again.poll() is not None,
        10,
        "/health after the release",
    )
    assert again.poll() is None, d.log_text()
