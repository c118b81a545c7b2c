"""The fake vLLM's streaming and engine (issue 29): vLLM's SSE chunk shapes for chat and completions,
timed tokens, --max-num-seqs queueing, a SIGSTOPped EngineCore, /metrics as the real 0.26.0 capture,
and its `vllm bench serve` writing vLLM's result format. The rest of the fake: tests/test_fake_vllm.py.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.host import http_request
from tests.test_fake_vllm import chat, run_cli, serve, status
from tests.test_server_support import Deployment, children_of, deployment_in, wait_for


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment_in(tmp_path)


def stream(d: Deployment, path: str, body: dict[str, object]) -> list[str]:
    """The `data:` payloads of a streamed answer, read as they come (chunked SSE over HTTP/1.1)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    conn.request(
        "POST",
        path,
        json.dumps(body),
        {"Authorization": f"Bearer {d.key}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type", "").startswith("text/event-stream")
    events = [line[len(b"data: ") :].decode().strip() for line in resp if line.startswith(b"data: ")]
    conn.close()
    return events


def metric(d: Deployment, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = http_request("GET", "127.0.0.1", d.port, "/metrics").body.decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_streamed_chat_has_vllms_chunks_usage_last_then_done(deployment: Deployment) -> None:
    d = deployment
    serve(d, "--served-model-name", "m")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "one two three"}],
        "stream": True,
        "max_tokens": 12,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    events = stream(d, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    content = chunks[1:-1]
    assert len(content) == 12  # ignore_eos: max_tokens tokens, one a chunk
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 11 + ["length"]
    assert "stop_reason" in content[-1]["choices"][0] and "stop_reason" not in content[0]["choices"][0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 11,
        "total_tokens": 23,
        "completion_tokens": 12,
    }
    assert metric(d, "vllm:generation_tokens_total") == 12.0
    assert metric(d, "vllm:prompt_tokens_total") == 11.0
    assert metric(d, "vllm:time_to_first_token_seconds_count") == 1.0
    assert metric(d, "vllm:request_success_total") == 1.0


def test_streamed_completion_without_eos_stops_at_the_answer(deployment: Deployment) -> None:
    d = deployment
    serve(d)
    body = {"prompt": "The capital of France is", "stream": True, "max_tokens": 100}
    events = stream(d, "/v1/completions", body)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all("usage" not in c for c in chunks)  # no include_usage
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The capital of France is Paris."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_prompt_past_max_model_len_is_refused_like_vllm(deployment: Deployment) -> None:
    d = deployment
    serve(d, "--max-model-len", "64")
    status, body = chat(d, {"messages": [{"role": "user", "content": "w " * 60}], "max_tokens": 10}, d.key)
    assert status == 400 and "maximum context length is 64 tokens" in str(body)


def test_max_num_seqs_queues_the_rest_and_metrics_show_it(deployment: Deployment) -> None:
    import threading

    d = deployment
    serve(d, "--max-num-seqs", "2", FAKE_VLLM_TOKEN_S="0.02")
    firsts: list[int] = []

    def one(i: int) -> None:
        stream(
            d,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": f"n{i}"}],
                "stream": True,
                "max_tokens": 40,
                "ignore_eos": True,
            },
        )
        firsts.append(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    wait_for(lambda: metric(d, "vllm:num_requests_waiting") == 3.0, 10, "three waiting")
    assert metric(d, "vllm:num_requests_running") == 2.0
    for t in threads:
        t.join(30)
    assert len(firsts) == 5 and metric(d, "vllm:num_requests_running") == 0.0
    assert metric(d, "vllm:generation_tokens_total") == 200.0
    assert metric(d, "vllm:request_queue_time_seconds_count") == 5.0


def test_a_stopped_engine_core_moves_no_token_while_health_answers(deployment: Deployment) -> None:
    import threading

    d = deployment
    proc = serve(d, FAKE_VLLM_TOKEN_S="0.01")
    (engine,) = children_of(proc.pid)
    os.kill(engine, signal.SIGSTOP)
    try:
        done = threading.Event()
        threading.Thread(
            target=lambda: (chat(d, {"messages": [{"role": "user", "content": "hi"}]}, d.key), done.set()),
            daemon=True,
        ).start()
        wait_for(lambda: metric(d, "vllm:num_requests_running") == 1.0, 5, "a running request")
        before = metric(d, "vllm:generation_tokens_total")
        assert status(d, "/health") == 200 and not done.wait(1.0)
        assert metric(d, "vllm:generation_tokens_total") == before == 0.0
    finally:
        os.kill(engine, signal.SIGCONT)
    assert done.wait(10)
    assert metric(d, "vllm:generation_tokens_total") > 0


RESULT_KEYS = {  # vLLM 0.26 benchmarks/serve.py's result JSON, the fields reconcile reads and more
    "date",
    "backend",
    "model_id",
    "num_prompts",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
}


def test_bench_serve_sends_real_load_and_writes_vllms_result_format(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    serve(d, "--served-model-name", "m")
    argv = [
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        f"http://127.0.0.1:{d.port}",
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        str(d.model_dir),
        "--served-model-name",
        "m",
        "--dataset-name",
        "random",
        "--random-input-len",
        "40",
        "--random-output-len",
        "24",
        "--num-prompts",
        "6",
        "--max-concurrency",
        "3",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "r.json",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
    ]
    done = run_cli(*argv, OPENAI_API_KEY=d.key)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert set(result) >= RESULT_KEYS
    assert (result["completed"], result["failed"], result["num_prompts"]) == (6, 0, 6)
    assert result["total_input_tokens"] == 240 and result["total_output_tokens"] == 144  # random: ignore_eos
    assert result["p50_ttft_ms"] <= result["p99_ttft_ms"] and result["mean_e2el_ms"] > result["mean_ttft_ms"]
    assert metric(d, "vllm:generation_tokens_total") == 144.0  # the server did the work
    assert metric(d, "vllm:request_success_total") == 6.0

    refused = run_cli(*argv[:-5], "--result-filename", "none.json", "--disable-tqdm", OPENAI_API_KEY="wrong")
    assert json.loads((tmp_path / "none.json").read_text())["completed"] == 0
    assert "All requests failed" in refused.stderr


def test_metrics_are_named_and_typed_as_the_real_capture(deployment: Deployment) -> None:
    d = deployment
    serve(d, "--served-model-name", "tiny")
    mine = http_request("GET", "127.0.0.1", d.port, "/metrics").body.decode().splitlines()
    real = (
        (Path(__file__).parent / "fixtures" / "vllm-metrics" / "0.26.0-captured.txt").read_text().splitlines()
    )
    heads = [line for line in mine if line.startswith(("# TYPE vllm:", "# HELP vllm:"))]
    assert len(heads) > 30 and [line for line in heads if line not in real] == []
    buckets = [line.split(" ")[0] for line in mine if "time_to_first_token_seconds_bucket" in line]
    assert buckets == [line.split(" ")[0] for line in real if "time_to_first_token_seconds_bucket" in line]
