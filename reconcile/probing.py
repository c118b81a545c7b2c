"""Runs the probes a spec calls for, concurrently, and gathers their results into one `Observed`.

Called by the planner (`probe_all`) and by the executor's re-probes around each action (`probe_one`).
A probe that raises becomes that probe's ProbeFailure; it never hides the other probes' results.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes import apt, cuda, files, gpu, model, venv
from probes.common import Absent, Invalid, ProbeFailure, Unavailable

if TYPE_CHECKING:
    from reconcile.spec import Spec

ProbeFn = Callable[["Spec"], object]

PROBE_NAMES = ("gpu", "cuda", "apt", "venv", "model", "api_key", "server", "health")


@dataclass(frozen=True)
class Observed:
    """What the probes saw. None where the spec has no such section (so nothing was probed)."""

    gpu: gpu.GpuInventory | Unavailable | ProbeFailure | None
    cuda: cuda.CudaToolkit | ProbeFailure | None
    apt: apt.AptObservation | Unavailable | ProbeFailure | None
    venv: venv.VenvObservation | Absent | Invalid | ProbeFailure | None
    model: model.ModelObservation | Absent | Invalid | ProbeFailure | None
    api_key: files.FileFacts | Absent | ProbeFailure | None
    # probes.server.ServerObservation / probes.health.HealthObservation, or Unavailable/ProbeFailure.
    server: Any
    health: Any

    def failures(self) -> dict[str, ProbeFailure]:
        """The probes that failed (the plan exits 1 when any did)."""
        return {n: r for n in PROBE_NAMES if isinstance(r := getattr(self, n), ProbeFailure)}


def _late_bound(module_name: str) -> ProbeFn:
    """A probe from a module that may not exist yet in this tree; imported when first run."""

    def run(spec: Spec) -> object:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return Unavailable(f"{module_name} does not exist in this build")
        result: object = module.probe(spec)
        return result

    return run


DEFAULT_PROBES: Mapping[str, ProbeFn] = {
    "gpu": gpu.probe,
    "cuda": cuda.probe,
    "apt": apt.probe,
    "venv": venv.probe,
    "model": model.probe,
    "api_key": files.probe,
    "server": _late_bound("probes.server"),
    "health": _late_bound("probes.health"),
}


def wanted(spec: Spec, name: str) -> bool:
    """Whether the spec has the section this probe looks at (health checks the server's endpoint)."""
    if name not in PROBE_NAMES:
        raise ValueError(f"unknown probe {name!r} (known: {', '.join(PROBE_NAMES)})")
    section = "server" if name == "health" else name
    return getattr(spec, section) is not None


def run_guarded(name: str, fn: ProbeFn, spec: Spec) -> object:
    """Run one probe; an exception becomes a ProbeFailure naming the probe, with the traceback as raw."""
    try:
        return fn(spec)
    except Exception as exc:
        return ProbeFailure(f"{name} probe crashed: {type(exc).__name__}: {exc}", raw=traceback.format_exc())


def _table(probes: Mapping[str, ProbeFn] | None) -> dict[str, ProbeFn]:
    unknown = set(probes or {}) - set(PROBE_NAMES)
    if unknown:
        raise ValueError(f"unknown probe(s) {sorted(unknown)} (known: {', '.join(PROBE_NAMES)})")
    return {**DEFAULT_PROBES, **(probes or {})}


def probe_one(spec: Spec, name: str, probes: Mapping[str, ProbeFn] | None = None) -> object:
    """Re-probe one resource (the executor calls this before and after each action)."""
    if not wanted(spec, name):
        return None
    return run_guarded(name, _table(probes)[name], spec)


def probe_all(spec: Spec, probes: Mapping[str, ProbeFn] | None = None) -> Observed:
    """Run every probe the spec calls for at once, in threads; returns when the slowest is done.

    `probes` replaces some of the default probe functions by name (tests inject slow or failing ones).
    """
    table = _table(probes)
    names = [n for n in PROBE_NAMES if wanted(spec, n)]
    results: dict[str, object] = dict.fromkeys(PROBE_NAMES)
    if names:
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="probe") as pool:
            futures = {n: pool.submit(run_guarded, n, table[n], spec) for n in names}
            results.update({n: f.result() for n, f in futures.items()})
    return Observed(**results)  # type: ignore[arg-type]


def probe_some(spec: Spec, names: tuple[str, ...]) -> Observed:
    """Run only `names` (concurrently); every other probe's field is None."""
    todo = [n for n in names if wanted(spec, n)]
    results: dict[str, object] = dict.fromkeys(PROBE_NAMES)
    if todo:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            futures = {n: pool.submit(run_guarded, n, _table(None)[n], spec) for n in todo}
            results.update({n: f.result() for n, f in futures.items()})
    return Observed(**results)  # type: ignore[arg-type]
