"""Ctrl-C during `reconcile apply`: exit 130, and last-run.json and the textfile say "interrupted, not
converged" (before, both kept the previous run's "converged" while the venv was half made)."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.apply_support import Demo, group_member


def test_sigint_during_the_venv_exits_130_and_reports_interrupted_not_converged(demo: Demo) -> None:
    textfile = demo.root / "reconcile.prom"
    proc = demo.start("apply", "--textfile", str(textfile))
    deadline = time.monotonic() + 60
    while not group_member(proc.pid, "-m venv"):
        assert proc.poll() is None and time.monotonic() < deadline, "the venv was never created"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C on a terminal does: the whole foreground group
    run = demo.finish(proc)
    assert run.returncode == 130, run.output
    assert "Traceback" not in run.stderr and "interrupted" in run.stderr
    record = json.loads(demo.last_run.read_text())
    assert (record["outcome"], record["exit_code"], record["converged"]) == ("interrupted", 130, False)
    assert "not converged" in record["error"]
    metrics = textfile.read_text().splitlines()
    assert "reconcile_converged 0" in metrics
    assert "reconcile_last_run_exit_code 130" in metrics
    assert 'reconcile_runs_total{outcome="interrupted"} 1' in metrics
