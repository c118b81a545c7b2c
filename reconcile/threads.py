"""A few calls at once in plain threads: the probes of a plan, the plan's git lookup, nvcc's two runs.

Called by reconcile.plan.prober, reconcile.plan.planner and probes.cuda. concurrent.futures imports logging
(with string, threading's extras and queue: ~4-5 ms per process) for a pool that runs each call once;
a thread per call and a join do the same here. An exception in a call is raised again in the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Generic, TypeVar

    T = TypeVar("T")

    class _Generic(Generic[T]):
        """Background[T] to a type checker."""

else:

    class _Generic:
        """At run time Background[T] is Background: no typing.Generic (nor typing) to import."""

        def __class_getitem__(cls, item: object) -> type:
            return cls

    T = None


class Background(_Generic[T]):
    """`fn()` started in a thread now; `result()` waits for it and returns (or raises) what it did."""

    def __init__(self, fn: Callable[[], T], name: str | None = None) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the caller, as a future's result() would
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when no error was raised


def run_all(calls: Mapping[str, Callable[[], T]], prefix: str = "call") -> dict[str, T]:
    """Every call in a thread of its own, at once; their results by name when all are done."""
    started = {name: Background(fn, f"{prefix}-{name}") for name, fn in calls.items()}
    for job in started.values():
        job.wait()  # all of them first, as a pool's shutdown would: none left running on an error
    return {name: job.result() for name, job in started.items()}
