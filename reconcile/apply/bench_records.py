"""The bench runs kept per generation: `<state_dir>/bench/results.json` (0600 in 0700, read through
reconcile.safety.statefiles) with the chart beside it, each generation's headline figures, and what
a gated switch is held to. Called by the bench command, reconcile.apply.bench_gate and history."""

from __future__ import annotations

import json
import os

from reconcile.safety import statefiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

BENCH_DIR, RESULTS, CHART = "bench", "results.json", "chart.svg"
KEEP_RUNS = 200
TTFT_SLACK_S = 0.05  # a TTFT within this of the baseline never fails the gate (milliseconds are noise)


def bench_dir(state_dir: str) -> str:
    return os.path.join(state_dir, BENCH_DIR)


def runs(state_dir: str) -> list[dict[str, Any]]:
    """Every kept run, oldest first."""
    return statefiles.read_bench(os.path.join(bench_dir(state_dir), RESULTS))


def keep(state_dir: str, run_data: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """Add the run (measured on `generation`) to the records and redraw the chart beside them."""
    from reconcile.apply import bench_chart
    from reconcile.host import atomic_write
    from reconcile.safety.filesafety import PRIVATE_DIR, ensure_dir

    directory = bench_dir(state_dir)
    statefiles.clear_non_dir(directory, then=statefiles.NEW_DIR)  # a FIFO, file, link there: aside
    ensure_dir(directory, PRIVATE_DIR)
    entry = {**run_data, "generation": generation}
    problem = statefiles.BENCH_RUN.problem(entry, "run")
    if problem is not None:  # written, its reader would move every kept run aside at the next read
        from reconcile.errors import ReconcileError

        raise ReconcileError(f"bench: this run's figures are not kept: {problem}")
    kept = [*runs(state_dir), entry][-KEEP_RUNS:]
    body = {"format": statefiles.BENCH_FORMAT, "runs": kept}
    atomic_write(os.path.join(directory, RESULTS), (json.dumps(body, indent=1) + "\n").encode(), mode=0o600)
    svg = bench_chart.render(latest_by_generation(kept))
    atomic_write(os.path.join(directory, CHART), svg.encode(), mode=0o600)
    return entry


def latest_by_generation(all_runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each generation's newest run."""
    out: dict[int, dict[str, Any]] = {}
    for r in all_runs:
        if isinstance(r.get("generation"), int):
            out[r["generation"]] = r
    return dict(sorted(out.items()))


def shape(run_data: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """The profile a run measured: (prompt, gen, concurrency, requests) per row."""
    return [
        (
            int(r.get("prompt", 0)),
            int(r.get("gen", 0)),
            int(r.get("concurrency", 1)),
            int(r.get("requests", 1)),
        )
        for r in run_data.get("rows") or []
    ]


def headline(run_data: dict[str, Any]) -> dict[str, float | None]:
    """TTFT of the largest single-stream prompt, decode tok/s of the long generation, the concurrent
    rows' aggregate tok/s: the figures `history` shows and the gate holds a switch to."""
    from reconcile.apply.bench_chart import headline as of_run

    return of_run(run_data)


def regressions(old: dict[str, Any], new: dict[str, Any], tolerance: float) -> list[str]:
    """Each headline figure of `new` worse than `old`'s by more than `tolerance`, with the numbers."""
    a, b = headline(old), headline(new)
    out = []
    for name, label, higher_is_better in (
        ("decode_tok_s", "decode tok/s", True),
        ("aggregate_tok_s", "concurrent aggregate tok/s", True),
        ("ttft_s", "TTFT (largest prompt) s", False),
    ):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x <= 0:
            continue
        change = (y - x) / x
        worse = -change if higher_is_better else change
        if name == "ttft_s" and y - x <= TTFT_SLACK_S:
            continue
        if worse > tolerance:
            out.append(f"{label} {y:.4g} vs {x:.4g} ({change:+.0%}, tolerance {tolerance:.0%})")
    return out
