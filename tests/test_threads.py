"""reconcile.threads: calls run at once, results by name, an error raised only once all are done."""

from __future__ import annotations

import threading

import pytest

from reconcile.threads import Background, run_all


def test_calls_run_at_once_and_their_results_come_back_by_name() -> None:
    both = threading.Barrier(2, timeout=30)  # each call waits for the other: they must overlap
    out = run_all({"a": lambda: (both.wait(), "A")[1], "b": lambda: (both.wait(), "B")[1]})
    assert out == {"a": "A", "b": "B"}


def test_an_error_is_raised_in_the_caller_after_every_call_has_finished() -> None:
    started, finished = threading.Event(), []

    def slow() -> str:
        started.wait(30)
        finished.append("slow")
        return "done"

    def failing() -> str:
        started.set()
        raise ValueError("probe exploded")

    with pytest.raises(ValueError, match="probe exploded"):
        run_all({"failing": failing, "slow": slow})
    assert finished == ["slow"]


def test_background_hands_back_the_value_or_the_error() -> None:
    assert Background(lambda: 42).result() == 42
    job: Background[int] = Background(lambda: 1 // 0)
    with pytest.raises(ZeroDivisionError):
        job.result()
