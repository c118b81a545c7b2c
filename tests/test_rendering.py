"""The text plan: findings by severity, and the memory table shown whatever the verdict (a failing fit,
or another rule's error, must not hide it)."""

from __future__ import annotations

import io
from typing import Any

from reconcile.plan.records import Plan
from reconcile.plan.render import render_text
from reconcile.preflight.gather import run_preflight
from tests.test_preflight import GOOD, spec


def copied(record: Any, **changes: Any) -> Any:
    """A copy of a record with changes."""
    return record._replace(**changes)


def rendered(plan: Plan) -> str:
    out = io.StringIO()
    render_text(plan, out)
    return out.getvalue()


def plan_of(seqs: int = 16, **inputs: object) -> Plan:
    s = spec(server={"args": {"max-model-len": 1048576, "max-num-seqs": seqs}})
    findings = run_preflight(s, copied(GOOD, **inputs))  # type: ignore[arg-type]
    return Plan("specs/x.toml", "host", "0" * 64, "git", (), findings)


def test_the_memory_table_stays_when_another_rule_fails_and_the_fit_warns() -> None:
    text = rendered(plan_of(1024, nvcc_version="12.8"))  # 1,024 sequences' Mamba state: a warning
    assert "✗ preflight        nvcc 12.8 is too old" in text.replace("  ✗", "✗")
    assert "⚠ preflight        one request of 1,048,576 tokens fits, but 1024" in text
    assert "KV cache (pred.)" in text and "short by" in text
    assert text.rstrip().endswith("apply will not start until fixed.")


def test_the_memory_table_is_shown_with_a_failing_fit() -> None:
    tiny = (copied(GOOD.gpus[0], total_bytes=8 * 2**30), copied(GOOD.gpus[1], total_bytes=8 * 2**30))  # type: ignore[index]
    text = rendered(plan_of(gpus=tiny))
    fit = [line for line in text.splitlines() if "[memory.fit]" in line]
    assert fit and fit[0].lstrip().startswith("✗ preflight")
    after = text.split(fit[0], 1)[1]
    assert "weights " in after and "KV cache (pred.)" in after
