"""Runs the probes a spec calls for and gathers their results into one `Observed`.

Called by the planner (`probe_all`) and by the executor's re-probes around each action (`probe_some`).
A probe's module is imported only when a spec needs it. A probe that raises becomes its ProbeFailure;
it never hides the other probes' results.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from probes.common import Absent, Invalid, ProbeFailure, Unavailable
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.api_key import FileFacts
    from probes.apt import AptObservation
    from probes.cuda import CudaToolkit
    from probes.gpu import GpuInventory
    from probes.model import ModelObservation
    from probes.venv import VenvObservation
    from reconcile.spec.models import Spec

ProbeFn = Callable[["Spec"], object]


class Probe(Record):
    """A probe: its module under `probes/` (imported only when a spec needs it) and the spec section
    whose presence calls for it. Each resource row names the probes its planner reads.

    `waits`: it spends its time waiting on something outside this process (the driver, a child
    process, a socket), so it runs in a thread of its own while the others run one after another in
    the caller's. The others are Python reading local files, which threads only slow down: they take
    turns on the interpreter's lock (a warm 500-package plan was ~3 ms slower with each in a thread)."""

    name: str
    module: str
    section: str
    waits: bool = False


PROBES: tuple[Probe, ...] = (
    Probe("gpu", "probes.gpu", "gpu", waits=True),  # NVML's calls into the driver
    Probe("cuda", "probes.cuda", "cuda", waits=True),  # nvcc, when its answers are not remembered
    Probe("apt", "probes.apt", "apt", waits=True),  # dpkg-query (~10-25 ms of its own)
    Probe("venv", "probes.venv", "venv"),
    Probe("model", "probes.model", "model"),
    Probe("api_key", "probes.api_key", "api_key"),
    Probe("server", "probes.server", "server"),
    Probe("health", "probes.health", "server", waits=True),  # HTTP to the server's endpoint
)

PROBE_NAMES = tuple(p.name for p in PROBES)
_BY_NAME = {p.name: p for p in PROBES}


class Observed(Record):
    """What the probes saw. None where the spec has no such section (so nothing was probed)."""

    gpu: GpuInventory | Unavailable | ProbeFailure | None
    cuda: CudaToolkit | ProbeFailure | None
    apt: AptObservation | Unavailable | ProbeFailure | None
    venv: VenvObservation | Absent | Invalid | ProbeFailure | None
    model: ModelObservation | Absent | Invalid | ProbeFailure | None
    api_key: FileFacts | Absent | ProbeFailure | None
    # probes.server.ServerObservation / probes.health.HealthObservation, or Unavailable/ProbeFailure.
    server: Any
    health: Any


def default_probe(name: str) -> ProbeFn:
    """The probe function of `name`, from its module (imported now, the first time it is needed)."""
    module = _BY_NAME[name].module
    __import__(module)  # importlib.import_module's work, without importing importlib (and warnings)
    fn: ProbeFn = sys.modules[module].probe
    return fn


def wanted(spec: Spec, name: str) -> bool:
    """Whether the spec has the section this probe looks at."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown probe {name!r} (known: {', '.join(PROBE_NAMES)})")
    return getattr(spec, _BY_NAME[name].section) is not None


def run_guarded(name: str, fn: ProbeFn, spec: Spec) -> object:
    """Run one probe; an exception becomes a ProbeFailure naming the probe, with the traceback as raw."""
    try:
        return fn(spec)
    except Exception as exc:
        import traceback  # linecache, tokenize: only when a probe crashed

        return ProbeFailure(f"{name} probe crashed: {type(exc).__name__}: {exc}", raw=traceback.format_exc())


def _call(name: str, fn: ProbeFn, spec: Spec) -> Callable[[], object]:
    return lambda: run_guarded(name, fn, spec)


def _resolve(names: list[str], probes: Mapping[str, ProbeFn] | None) -> dict[str, ProbeFn]:
    unknown = set(probes or {}) - set(PROBE_NAMES)
    if unknown:
        raise ValueError(f"unknown probe(s) {sorted(unknown)} (known: {', '.join(PROBE_NAMES)})")
    given = probes or {}
    return {n: given[n] if n in given else default_probe(n) for n in names}


def _run(spec: Spec, names: list[str], probes: Mapping[str, ProbeFn] | None) -> Observed:
    results: dict[str, object] = dict.fromkeys(PROBE_NAMES)
    table = _resolve(names, probes)
    waiting = [n for n in names if _BY_NAME[n].waits]
    here = [n for n in names if not _BY_NAME[n].waits]
    if waiting and not here:
        here.append(waiting.pop())  # this thread would only wait: it runs one of them itself
    jobs = {}
    if waiting:
        from reconcile.threads import Background

        jobs = {n: Background(_call(n, table[n], spec), f"probe-{n}") for n in waiting}
    for name in here:
        results[name] = run_guarded(name, table[name], spec)
    for name, job in jobs.items():
        results[name] = job.result()
    return Observed(**results)  # type: ignore[arg-type]


def probe_one(spec: Spec, name: str, probes: Mapping[str, ProbeFn] | None = None) -> object:
    """Re-probe one resource's probe alone; None when the spec has no section for it."""
    if not wanted(spec, name):
        return None
    return run_guarded(name, _resolve([name], probes)[name], spec)


def probe_all(spec: Spec, probes: Mapping[str, ProbeFn] | None = None) -> Observed:
    """Run every probe the spec calls for: those that wait (Probe.waits) in threads, all at once, while
    this thread runs the others; returns when the slowest is done.

    `probes` replaces some of the default probe functions by name (tests inject slow or failing ones).
    """
    return _run(spec, [n for n in PROBE_NAMES if wanted(spec, n)], probes)


def probe_some(spec: Spec, names: tuple[str, ...]) -> Observed:
    """Run only `names` (as probe_all runs them); every other probe's field is None."""
    return _run(spec, [n for n in names if wanted(spec, n)], None)
