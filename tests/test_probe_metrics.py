"""probes.metrics on vLLM 0.26.0's /metrics page (tests/fixtures/vllm-metrics/: composed from vLLM's source
until a capture from the lab replaces it), served by a real listener on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import metrics
from reconcile.spec.models import Spec

PAGE = Path(__file__).parent / "fixtures" / "vllm-metrics" / "0.26.0-composed.txt"
LATER = (  # the same page a second on: 250 more tokens generated
    'vllm:generation_tokens_total{engine="0",model_name="nemotron"} 48213.0',
    'vllm:generation_tokens_total{engine="0",model_name="nemotron"} 48463.0',
)


def test_the_names_the_probe_reads_are_on_the_page_and_parse() -> None:
    text = PAGE.read_text()
    for name in (metrics.RUNNING, metrics.WAITING, metrics.KV_USAGE, metrics.GENERATED):
        assert f"\n{name}{{" in text, name
    assert metrics.OLD_KV_USAGE not in text  # gone since vLLM 0.12
    found = metrics.parse_prometheus(text)
    assert found[metrics.RUNNING] == 3.0 and found[metrics.WAITING] == 1.0
    assert found[metrics.KV_USAGE] == 0.1875 and found[metrics.GENERATED] == 48213.0
    assert found["vllm:request_success_total"] == 97.0  # summed over finished_reason
    assert found["vllm:iteration_tokens_total_bucket"] == pytest.approx(
        sum([4870, 5122, 5130, 5131, 5133, 5140, 5152, 5160, 5171, 5198, 5201, 5203, 5203, 5203])
    )  # a histogram whose own name ends in _total: its buckets are not the counter


# The page's server: a process of the deployment (its marker), as vLLM is: the probe reads /metrics only
# from a listener that is the deployment's own. It prints each path asked.
SERVE = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
pages = [open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()]
asked = []
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        asked.append(self.path)
        print(self.path, flush=True)
        body = pages[min(len(asked), 2) - 1]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Spec, subprocess.Popen[str]]]:
    from reconcile.identity import MARKER, deployment_id

    later = tmp_path / "later.txt"
    later.write_text(PAGE.read_text().replace(*LATER))
    spec = Spec.model_validate(
        {
            "machine": {"state_dir": str(tmp_path / "state")},
            "model": {"dir": str(tmp_path / "model")},
            "server": {
                "name": "nemotron",
                "log": str(tmp_path / "log"),
                "executable": "/bin/true",
                "host": "127.0.0.1",
                "port": 8000,  # the child's, below
            },
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(PAGE), str(later)],
        env={**os.environ, MARKER: deployment_id(spec)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    bound = int(proc.stdout.readline())
    spec = spec.model_copy(update={"server": spec.server.model_copy(update={"port": bound})})  # type: ignore[union-attr]
    try:
        yield spec, proc
    finally:
        proc.kill()
        proc.communicate(timeout=5)


def test_the_probe_reads_the_load_and_the_throughput_from_the_page(
    served: tuple[Spec, subprocess.Popen[str]],
) -> None:
    spec, proc = served
    seen = metrics.probe(spec, window=0.2)
    assert isinstance(seen, metrics.ServingMetrics), seen
    assert proc.stdout is not None
    assert [proc.stdout.readline().strip() for _ in range(2)] == ["/metrics", "/metrics"]
    assert (seen.requests_running, seen.requests_waiting, seen.kv_cache_usage) == (3.0, 1.0, 0.1875)
    assert seen.generation_tokens_total == 48463.0
    assert seen.generation_tokens_per_s is not None
    assert seen.generation_tokens_per_s == pytest.approx(250 / seen.window_s, rel=0.05)


def test_a_line_that_is_not_prometheus_is_an_error_naming_it() -> None:
    bad = PAGE.read_text().replace("vllm:num_requests_waiting{", "vllm:num_requests waiting{", 1)
    with pytest.raises(metrics.ParseError, match="not a Prometheus sample line"):
        metrics.parse_prometheus(bad)


CAPTURED = Path(__file__).parent / "fixtures" / "vllm-metrics" / "0.26.0-captured.txt"


def test_a_page_captured_from_real_vllm_parses_with_the_names_the_probe_reads() -> None:
    """Recorded on the H200 lab (tools/capture_vllm_metrics.sh): real vLLM 0.26.0 serving a tiny
    model after three 16-token chats. The composed page above must not drift from it: every metric
    family the probe reads is on both, with the same labels."""
    text = CAPTURED.read_text()
    for name in (metrics.RUNNING, metrics.WAITING, metrics.KV_USAGE, metrics.GENERATED):
        assert f'\n{name}{{engine="0",model_name="tiny"}} ' in text, name
    found = metrics.parse_prometheus(text)
    assert found[metrics.RUNNING] == 0.0 and found[metrics.WAITING] == 0.0
    assert found[metrics.GENERATED] == 48.0  # three chats of max_tokens 16
    assert found["vllm:request_success_total"] == 3.0  # summed over finished_reason

    def families(page: str) -> set[str]:
        return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE vllm:")}

    composed = families(PAGE.read_text())
    assert composed <= families(text), composed - families(text)
