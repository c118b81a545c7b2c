"""`reconcile bench` end to end on the CPU demo: the fake vLLM streams timed tokens, the fake
`vllm bench serve` sends the load over HTTP and writes vLLM's result JSON; the table, the records kept
with the generation (0600 in 0700), `history`'s headline, `--compare`, the chart, and the gate that
rolls back a generation made slower on purpose (`--max-num-seqs 1` against 8 concurrent streams)."""

from __future__ import annotations

import json
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in
from tests.ownership_support import SPY, as_nobody, received, root_only
from tests.test_server_support import generated_tokens


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def spec_with(demo: Demo, *, seqs: int, bench: str = "", token_s: str = "0.0005") -> None:
    def edit(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = seqs
        doc["server"]["env"]["FAKE_VLLM_TOKEN_S"] = token_s

    path = demo.write_spec(edit)
    if bench:
        path.write_text(path.read_text() + "\n" + bench)


def generated(demo: Demo) -> float:
    return generated_tokens(demo.port)


def test_bench_prints_the_reference_table_and_keeps_it_with_the_generation(demo: Demo) -> None:
    spec_with(demo, seqs=8)
    assert demo.cli("apply").returncode == 2
    before = generated(demo)
    run = demo.cli("bench", timeout=300)
    assert run.returncode == 0, run.output
    out = run.stdout
    assert "SINGLE-STREAM DECODE (512 generation tokens, varying prompt size):" in out, out
    # The reference's prompt sizes (243 ... 116,524 of 1,048,576) scaled to max-model-len 2048.
    prompts = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert prompts == ["16", "28", "114", "228"], out
    assert "LONG GENERATION (1024 output, 24-token prompt)" in out
    assert "CONCURRENT (8 parallel streams, 512 gen each): total=4096 tokens" in out
    assert "bench 1/6: prompt 16, gen 512" in run.stderr  # progress while it runs
    assert generated(demo) - before == 4 * 512 + 1024 + 8 * 512  # the server did the work

    directory = demo.state_dir / "bench"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("results.json", "chart.svg"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    (kept,) = json.loads((directory / "results.json").read_text())["runs"]
    assert kept["generation"] == 1 and kept["machine"]["vllm"] == "0.26.0"
    svg = ET.fromstring((directory / "chart.svg").read_text())
    assert svg.tag.endswith("svg") and "gen 1" in "".join(svg.itertext())

    # A profile of the spec's own ([bench] is not part of the generation: still generation 1).
    spec_with(
        demo,
        seqs=8,
        bench="[bench]\nrows = [{ prompt = 100, gen = 20 }, { prompt = 10, gen = 30, concurrency = 3 }]\n",
    )
    as_json = demo.cli("bench", "--json", timeout=300)
    assert as_json.returncode == 0, as_json.output
    data = as_json.json()
    assert data["format"] == "reconcile-bench/1" and data["generation"] == 1
    assert [(r["name"], r["prompt"], r["gen"]) for r in data["rows"]] == [("single", 100, 20), ("3x", 10, 30)]
    assert data["rows"][-1]["vllm_result"]["completed"] == 3  # vLLM's own result, kept
    assert data["rows"][-1]["figures"]["gen"] == 30.0
    assert all(v > 0 for v in data["headline"].values())
    assert len(json.loads((directory / "results.json").read_text())["runs"]) == 2

    history = demo.cli("history").stdout
    assert "bench: TTFT" in history and "tok/s concurrent" in history, history


def test_bench_with_no_server_says_so_in_one_line(demo: Demo) -> None:
    run = demo.cli("bench")
    assert run.returncode == 1
    assert "is not serving" in run.stderr and "reconcile apply" in run.stderr, run.output
    assert "Traceback" not in run.output


GATE = """[bench]
gate = true
tolerance = 0.3
rows = [{ prompt = 32, gen = 48 }, { prompt = 32, gen = 48, concurrency = 8 }]
"""


def test_the_gate_rolls_back_a_generation_slower_beyond_tolerance(demo: Demo) -> None:
    spec_with(demo, seqs=8, bench=GATE, token_s="0.01")
    first = demo.cli("apply", timeout=300)
    assert first.returncode == 2, first.output
    identity = demo.server_environ("RECONCILE_IDENTITY")
    assert "bench gate: bench 2/2" in first.stderr  # the first figures: the baseline

    spec_with(demo, seqs=1, bench=GATE, token_s="0.01")  # one sequence at a time: 8 streams queue
    slow = demo.cli("apply", timeout=300)
    assert slow.returncode == 4, slow.output
    assert (
        "automatic rollback to generation 1: bench gate: slower than generation 1: "
        "concurrent aggregate tok/s" in slow.stdout
    ), slow.output
    assert "tolerance 30%" in slow.stdout and "it serves again" in slow.stdout
    assert demo.server_environ("RECONCILE_IDENTITY") == identity
    assert demo.cli("check").returncode == 0

    history = demo.cli("history").stdout
    assert "✗ failed" in history and "bench gate: slower than generation 1" in history, history
    assert history.count("bench: TTFT") == 2  # both generations' figures
    compare = demo.cli("bench", "--compare", "1", "2")
    assert compare.returncode == 0, compare.output
    lines = compare.stdout.splitlines()
    assert lines[0] == "generation 1 -> 2"
    row = next(line for line in lines if line.startswith("8x"))
    assert row.split()[-1].startswith("-"), compare.stdout  # the aggregate fell

    timer = demo.cli("apply", "--scheduled")  # held: no bench, no restart each tick
    assert timer.returncode == 0, timer.output
    assert "bench gate" not in timer.stderr


def test_a_generation_within_tolerance_passes_the_gate(demo: Demo) -> None:
    loose = GATE.replace("tolerance = 0.3", "tolerance = 0.6")  # as fast, give or take a loaded CI machine
    spec_with(demo, seqs=8, bench=loose, token_s="0.01")
    assert demo.cli("apply", timeout=300).returncode == 2
    spec_with(demo, seqs=9, bench=loose, token_s="0.01")  # a new generation, as fast
    second = demo.cli("apply", timeout=300)
    assert second.returncode == 2, second.output
    assert "automatic rollback" not in second.stdout
    runs = json.loads((demo.state_dir / "bench" / "results.json").read_text())["runs"]
    assert [r["generation"] for r in runs] == [1, 2]


@root_only
def test_the_key_never_reaches_a_foreign_listener_on_the_port(demo: Demo, strangers: list[int]) -> None:
    """A user without privileges listening on the deployment's port (the server is down) is asked
    nothing with the key: bench refuses in one line, and `vllm bench serve` is never started."""
    key = "k-" + "7" * 40
    demo.key_file.parent.mkdir(parents=True, exist_ok=True)
    demo.key_file.write_text(key + "\n")
    demo.key_file.chmod(0o600)
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(demo.port)], {}, strangers)
    for _ in range(2):  # with the key file, and without one: a foreign listener is never measured
        run = demo.cli("bench")
        assert run.returncode == 1, run.output
        assert "nobody" in run.stderr and "not sent there" in run.stderr, run.output
        assert "Traceback" not in run.output and "bench 1/" not in run.stderr
        demo.key_file.unlink(missing_ok=True)
    got = received(spy)
    assert key not in got and "authorization" not in got.lower() and "chat/completions" not in got
    assert not (demo.state_dir / "bench" / "results.json").exists()


def test_damaged_records_are_moved_aside_and_a_row_too_long_is_named(demo: Demo) -> None:
    spec_with(demo, seqs=8)
    assert demo.cli("apply").returncode == 2
    directory = demo.state_dir / "bench"
    directory.mkdir(mode=0o700)
    (directory / "results.json").write_text('{"format": "reconcile-bench/1", "runs": [{"at": "x"}]}')
    history = demo.cli("history")
    assert history.returncode == 0 and "Traceback" not in history.output, history.output
    assert "bench:" not in history.stdout
    assert not (directory / "results.json").exists()
    assert len(list(directory.glob("results.json.corrupt-*"))) == 1
    too_long = "[bench]\nrows = [{ prompt = 2000, gen = 100 }]\n"
    spec_with(demo, seqs=8, bench=too_long)
    run = demo.cli("bench")
    assert run.returncode == 1 and "Traceback" not in run.output, run.output
    assert f"{demo.spec_path}: [bench].rows[0]: prompt 2000 + gen 100 does not fit max-model-len 2048" in (
        run.stderr
    ), run.output
