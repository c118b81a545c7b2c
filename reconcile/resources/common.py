"""What every resource module shares: the declaration records (`Probe`, `Kind`), the planner and
action signatures, and the plan items a planner returns. Imported by reconcile.resources.* only.

A planner builds its items with `change(...)` and `ok(...)`, which carry no resource name: the
planner wrapper (reconcile.plan.planner) stamps the name of the row that asked, so a planner cannot
mislabel what it plans.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType

from probes.common import ProbeFailure, Unavailable
from reconcile.plan.records import Action, Change, Ok
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.plan.records import ActionResult, ChangeKind, FieldDiff, Item
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec

Progress = Callable[[str], None]
ProbeFn = Callable[["Spec"], object]
Planner = Callable[["Spec", "Observed"], "Item | None"]
Perform = Callable[["LoadedSpec", "Change", Progress], "ActionResult"]
AfterPlan = Callable[["Item", "Spec", "Observed", list[str]], "Item"]
Remember = Callable[["Spec", "Observed"], None]
DependsOn = Callable[["Spec"], tuple[str, ...]]


class Probe(Record):
    """A probe, the read half of a resource: its module under `probes/` (imported only when a spec
    needs it; its `probe(spec)` is the probe), the spec section whose presence calls for it, and the
    JSON tags of the record types it returns (class name -> tag; tags never change, class names may).

    `threaded`: it spends its time waiting on something outside this process (the driver, a child
    process, a socket), so it runs in a thread of its own while the others run one after another in
    the caller's. The others are Python reading local files, which threads only slow down: they take
    turns on the interpreter's lock (a warm 500-package plan was ~3 ms slower with each in a thread)."""

    name: str
    module: str
    section: str
    threaded: bool = False
    tags: Mapping[str, str] = MappingProxyType({})

    def wanted(self, spec: Spec) -> bool:
        """Whether the spec has the section this probe looks at."""
        return getattr(spec, self.section) is not None

    def function(self) -> ProbeFn:
        """The probe function, from its module (imported now, the first time it is needed)."""
        __import__(self.module)  # importlib.import_module's work, without importing importlib (and warnings)
        fn: ProbeFn = sys.modules[self.module].probe
        return fn


def _nothing(spec: Spec) -> tuple[str, ...]:
    return ()


class Kind(Record):
    """One resource, one row of the plan: its spec section, the probes its planner reads, its planner
    and its action (the write half; None: apply reports the drift, it never acts: GPUs, headers).

    `depends_on(spec)`: what must be true before its action runs (a failure there blocks it).
    `restarts_server`: the server's launch identity covers it, so a pending change to it restarts the
    server. `after_plan`: sees the whole plan's pending `restarts_server` changes and may revise the
    row's item. `serves`: its action switches what serves (apply judges a generation by its result).
    `remember`: apply, under its lock, after its first plan: keeps what the next run's plan compares
    against (the server row: an engine stall, so a liveness window spans scheduled applies)."""

    name: str
    section: str
    probes: tuple[str, ...]
    plan: Planner
    perform: Perform | None
    depends_on: DependsOn = _nothing
    restarts_server: bool = False
    after_plan: AfterPlan | None = None
    serves: bool = False
    remember: Remember | None = None


def needs(*names: str) -> DependsOn:
    """A `depends_on` that is always `names`."""
    return lambda spec: names


def change(
    kind: ChangeKind,
    summary: str,
    reason: str,
    diffs: tuple[FieldDiff, ...] = (),
    *,
    params: Mapping[str, Any] = MappingProxyType({}),
    actionable: bool = True,
    made_true_by: str | None = None,
) -> Change:
    """A Change for the row that asked (the planner wrapper puts its name and dependencies on it)."""
    return Change(
        "", kind, summary, reason, diffs, params=params, actionable=actionable, made_true_by=made_true_by
    )


def ok(summary: str) -> Ok:
    """An Ok for the row that asked (the planner wrapper puts its name on it)."""
    return Ok("", summary)


def failed(result: object, section: str) -> Change | None:
    """A probe that could not look: a drift apply cannot fix, with the probe's reason."""
    if isinstance(result, (ProbeFailure, Unavailable)):
        return change(
            Action.CHANGE,
            f"cannot be checked: {result.reason}",
            f"the {section} probe failed",
            actionable=False,
        )
    return None


def giB(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


def run_guarded(name: str, fn: ProbeFn, spec: Spec) -> object:
    """Run one probe; an exception becomes a ProbeFailure naming the probe, with the traceback as raw."""
    try:
        return fn(spec)
    except Exception as exc:
        import traceback  # linecache, tokenize: only when a probe crashed

        return ProbeFailure(f"{name} probe crashed: {type(exc).__name__}: {exc}", raw=traceback.format_exc())
