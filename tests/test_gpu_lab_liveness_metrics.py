"""Issue 24's eighth hostile round on a real GPU with real vLLM 0.26.0: the liveness look now hands
prometheus_client's parser only the three figures' sample lines, at most `probes.liveness.LINES_MAX` of
at most `LINE_MAX` bytes (a misbehaving /metrics of one 3.5 MB line held a plan past 90 s). This checks
that real vLLM's own exposition stays well inside those bounds and still gives the three figures, the
same sums as the whole exposition parsed unfiltered.

Skipped unless RECONCILE_GPU_LAB=1. Run alone on the lab machine by
`GPU_LAB_TESTS=tests/test_gpu_lab_liveness_metrics.py tools/gpu_lab.sh` (about 2 minutes: one start of
the tiny model, a few chats, one stop); it brings the lab spec up itself. Figures are printed and
written to $OUT/gpu-lab-liveness-metrics.json when $OUT is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, cli, dump_figures, get, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-liveness-metrics.json")
    cli("apply", "--spec", variant("stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def test_real_vllm_metrics_fit_the_liveness_bounds_and_give_the_same_figures() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from probes.liveness import GENERATED, LINE_MAX, LINES_MAX, RUNNING, WAITING, figures

    spec = variant("liveness-metrics", {})
    code, _out, _err, took = cli("apply", "--spec", spec)
    FIGURES["apply_s"] = round(took, 1)
    assert code in (0, 2)
    code, _out, _err, _took = cli("check", "--spec", spec)  # a chat: tokens generated, the counter moves
    assert code == 0
    status, text = get("/metrics", with_key=False)
    assert status == 200 and isinstance(text, str), status
    body = text.encode()
    names = (GENERATED, RUNNING, WAITING)
    wanted = [line for line in text.split("\n") if line.startswith(names)]
    whole: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                whole[sample.name] = whole.get(sample.name, 0.0) + float(sample.value)
    FIGURES.update(
        body_bytes=len(body),
        lines=text.count("\n"),
        figure_lines=len(wanted),
        longest_figure_line=max((len(line) for line in wanted), default=0),
        figures=figures(body),
        unfiltered=whole,
    )
    assert len(wanted) <= LINES_MAX // 10 and all(len(line) <= LINE_MAX // 2 for line in wanted), wanted
    assert figures(body) == whole and set(whole) == set(names), (figures(body), whole)
    assert whole[GENERATED] > 0
