"""Every resource reconcile manages, declared once: one module per kind, listed here in apply order.

Each module declares `PROBES` (the read half: its probes' modules, spec sections, threads and JSON
tags) and `KINDS` (its rows: planner, action, dependencies, restart semantics). The prober,
`Observed`, the planner, the executor's order and re-plans, the JSON type tags and the table in
docs/architecture.md are derived from them; nothing else knows the list of resources and nothing
compares their names. Adding one: docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconcile.resources import api_key, apt, cuda, front, gpu, model, server, venv
from reconcile.resources.common import Kind, Probe, run_guarded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Spec

MODULES = (gpu, apt, cuda, venv, model, api_key, server, front)  # the apply order

TABLE: tuple[Kind, ...] = tuple(kind for m in MODULES for kind in m.KINDS)
BY_NAME: Mapping[str, Kind] = {k.name: k for k in TABLE}
PROBES: tuple[Probe, ...] = tuple(p for m in MODULES for p in m.PROBES)
PROBE_NAMES: tuple[str, ...] = tuple(p.name for p in PROBES)
BY_PROBE: Mapping[str, Probe] = {p.name: p for p in PROBES}
TYPE_TAGS: Mapping[str, str] = {cls: tag for p in PROBES for cls, tag in p.tags.items()}


class Observed:
    """What the probes saw, by probe name: `obs.venv`, `obs.server`, ... (None where the spec has no
    such section, so nothing was probed). Built by the prober; `Observed(gpu=...)` in tests."""

    __slots__ = ("_results",)
    _fields: tuple[str, ...] = PROBE_NAMES

    def __init__(self, **results: object) -> None:
        unknown = results.keys() - BY_PROBE.keys()
        if unknown:
            raise TypeError(f"unknown probe(s) {sorted(unknown)} (known: {', '.join(PROBE_NAMES)})")
        self._results = {name: results.get(name) for name in PROBE_NAMES}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._results[name]
        except KeyError:
            raise AttributeError(name) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Observed) and self._results == other._results

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Observed({', '.join(f'{k}={v!r}' for k, v in self._results.items())})"

    def _replace(self, **results: object) -> Observed:
        return Observed(**{**self._results, **results})


def observe_here(spec: Spec, names: tuple[str, ...]) -> Observed:
    """Run the probes `names` the spec calls for, one after another in this thread; every other
    probe's field is None. For an action that needs the facts as they are now (the server's start)."""
    return Observed(
        **{n: run_guarded(n, BY_PROBE[n].function(), spec) for n in names if BY_PROBE[n].wanted(spec)}
    )
