"""`reconcile bench` and its gate on the H200 lab with real vLLM 0.26.0 (issue 29, items 1-3).
Skipped unless RECONCILE_GPU_LAB=1.

A: the lab spec with `[bench] gate = true` and a two-row profile (one stream, 8 concurrent): its
switch runs the profile and keeps the baseline. Then `reconcile bench` with the default profile (the
reference table scaled to max-model-len 1024) prints the table through the real `vllm bench serve`.
B: A with `--max-num-seqs 1` (8 streams now queue one behind the other): the gate measures the
concurrent aggregate fall beyond the tolerance and rolls back to A by itself (exit 4). Figures in
$OUT/gpu-lab-bench.json. About 4-5 minutes, estimated: three server starts of ~40 s, and nine
`vllm bench serve` runs, each importing vLLM and torch first (not measured yet).

    GPU_LAB_TESTS=tests/test_gpu_lab_bench.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, dump_figures, get, starts_in_log, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
GATE = """
[bench]
gate = true
tolerance = 0.3
rows = [{ prompt = 64, gen = 256 }, { prompt = 64, gen = 256, concurrency = 8 }]
"""
TABLE = "\n[bench]\n"  # the default profile: the reference table scaled to max-model-len


def spec(name: str, bench: str, replace: dict[str, str] | None = None) -> str:
    path = variant(f"bench-{name}", replace or {})
    with open(path, "a") as f:
        f.write(bench)
    return path


A = {"args = { max-model-len = 1024,": "args = { max-model-len = 1024, max-num-seqs = 16,"}
B = {"args = { max-model-len = 1024,": "args = { max-model-len = 1024, max-num-seqs = 1,"}


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    import shutil

    for sub in ("state/bench", "state/profile"):
        shutil.rmtree(LAB / sub, ignore_errors=True)
    yield
    dump_figures(FIGURES, "gpu-lab-bench.json")
    cli("apply", "--spec", variant("stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def test_a_gated_switch_keeps_the_baseline_then_bench_prints_the_reference_table() -> None:
    code, out, err, took = cli("apply", "--spec", spec("a", GATE, A))
    FIGURES["a_apply_s"] = round(took, 1)
    assert code == 2, out + err
    assert "bench gate: bench 2/2" in err, err
    runs = json.loads((LAB / "state" / "bench" / "results.json").read_text())["runs"]
    FIGURES["a_gate_run"] = runs[-1]
    assert runs[-1]["generation"] == 1 and runs[-1]["machine"]["gpu"] == "NVIDIA H200"

    code, out, err, took = cli("bench", "--spec", spec("table", TABLE, A))
    FIGURES["table"], FIGURES["table_s"] = out, round(took, 1)
    assert code == 0, out + err
    assert "SINGLE-STREAM DECODE (480 generation tokens, varying prompt size):" in out, out
    assert "LONG GENERATION" in out and "CONCURRENT (8 parallel streams" in out
    assert "vLLM 0.26.0" in out and "NVIDIA H200" in out
    code, out, _err, _took = cli("history", "--spec", spec("table", TABLE, A))
    assert code == 0 and "bench: TTFT" in out, out


def test_the_venv_can_run_vllm_bench_serve() -> None:
    """`vllm bench serve` imports aiohttp (and tqdm): the lab's --no-deps venv must hold them."""
    probe = subprocess.run(
        [str(LAB / "venv" / "bin" / "python"), "-c", "import aiohttp, tqdm, vllm.benchmarks.serve"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0 and not (LAB / "venv").exists():
        pytest.skip("no lab venv yet: the next test's apply makes it")
    FIGURES["venv_imports"] = probe.stderr.strip().splitlines()[-1:] or ["ok"]
    assert probe.returncode == 0, (
        "the lab venv cannot import vllm.benchmarks.serve: add aiohttp and its deps (aiosignal, "
        "aiohappyeyeballs, attrs, frozenlist, multidict, propcache, yarl) to gpu-lab/wheels.txt and "
        f"[venv.packages]: {probe.stderr[-500:]}"
    )


def test_a_generation_made_slower_on_purpose_is_rolled_back_by_the_gate() -> None:
    starts = starts_in_log()
    code, out, err, took = cli("apply", "--spec", spec("b", GATE, B))
    FIGURES["b_apply_s"] = round(took, 1)
    FIGURES["b_note"] = next((ln for ln in out.splitlines() if "automatic rollback to" in ln), "")
    assert code == 4, out + err
    assert "automatic rollback to generation 1: bench gate: slower than generation 1" in out, out
    assert "concurrent aggregate tok/s" in out and "it serves again" in out
    assert starts_in_log() == starts + 2  # B, then A again
    assert get("/v1/models")[0] == 200
    code, out, _err, _took = cli("bench", "--compare", "1", "2", "--spec", spec("b", GATE, B))
    FIGURES["compare"] = out
    assert code == 0 and out.startswith("generation 1 -> 2"), out
    runs = json.loads((LAB / "state" / "bench" / "results.json").read_text())["runs"]
    FIGURES["headlines"] = {
        str(r["generation"]): [r["rows"][-1]["figures"], r["rows"][0]["figures"]] for r in runs
    }
