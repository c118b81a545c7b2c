"""Runs the probes a spec calls for and gathers their results into one `Observed`.

The probes are the resources' declarations (`PROBES` of each reconcile/resources/<kind>.py). Called by
the planner (`probe_all`) and by the executor's re-probes around each action (`probe_some`). A probe's
module is imported only when a spec needs it. A probe that raises becomes its ProbeFailure; it never
hides the other probes' results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reconcile.resources import BY_PROBE, PROBE_NAMES, PROBES, Observed
from reconcile.resources.common import ProbeFn, run_guarded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec

__all__ = ["PROBES", "PROBE_NAMES", "Observed", "probe_all", "probe_one", "probe_some", "run_guarded"]


def default_probe(name: str) -> ProbeFn:
    """The probe function of `name`, from its module (imported now, the first time it is needed)."""
    return BY_PROBE[name].function()


def wanted(spec: Spec, name: str) -> bool:
    """Whether the spec has the section this probe looks at."""
    if name not in BY_PROBE:
        raise ValueError(f"unknown probe {name!r} (known: {', '.join(PROBE_NAMES)})")
    return BY_PROBE[name].wanted(spec)


def _call(name: str, fn: ProbeFn, spec: Spec) -> Callable[[], object]:
    return lambda: run_guarded(name, fn, spec)


def _resolve(names: list[str], probes: Mapping[str, ProbeFn] | None) -> dict[str, ProbeFn]:
    unknown = set(probes or {}) - set(PROBE_NAMES)
    if unknown:
        raise ValueError(f"unknown probe(s) {sorted(unknown)} (known: {', '.join(PROBE_NAMES)})")
    given = probes or {}
    return {n: given[n] if n in given else default_probe(n) for n in names}


def _run(spec: Spec, names: list[str], probes: Mapping[str, ProbeFn] | None) -> Observed:
    results: dict[str, object] = {}
    table = _resolve(names, probes)
    threaded = [n for n in names if BY_PROBE[n].threaded]
    here = [n for n in names if not BY_PROBE[n].threaded]
    if threaded and not here:
        here.append(threaded.pop())  # this thread would only wait: it runs one of them itself
    jobs = {}
    if threaded:
        from reconcile.threads import Background

        jobs = {n: Background(_call(n, table[n], spec), f"probe-{n}") for n in threaded}
    for name in here:
        results[name] = run_guarded(name, table[name], spec)
    for name, job in jobs.items():
        results[name] = job.result()
    return Observed(**results)


def probe_one(spec: Spec, name: str, probes: Mapping[str, ProbeFn] | None = None) -> object:
    """Re-probe one resource's probe alone; None when the spec has no section for it."""
    if not wanted(spec, name):
        return None
    return run_guarded(name, _resolve([name], probes)[name], spec)


def probe_all(spec: Spec, probes: Mapping[str, ProbeFn] | None = None) -> Observed:
    """Run every probe the spec calls for: the threaded ones (Probe.threaded) in threads, all at once,
    while this thread runs the others; returns when the slowest is done.

    `probes` replaces some of the default probe functions by name (tests inject slow or failing ones).
    """
    return _run(spec, [n for n in PROBE_NAMES if wanted(spec, n)], probes)


def probe_some(spec: Spec, names: tuple[str, ...]) -> Observed:
    """Run only `names` (as probe_all runs them); every other probe's field is None."""
    return _run(spec, [n for n in names if wanted(spec, n)], None)
