"""What a plan is made of: Changes (to make), Oks (already true) and Findings (preflight).

Pure data, built by `reconcile.plan.planner`, rendered by `reconcile.plan.render`, executed by
`reconcile.apply.changes`. Everything here is JSON-serialisable and holds no secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final, Literal

    ChangeKind = Literal["+", "~", "-", "±"]
    Severity = Literal["error", "warning", "info"]


class Action:
    """What apply will do to a resource: a Change's kind, as the text plan and JSON write it."""

    CREATE: Final = "+"
    CHANGE: Final = "~"
    REMOVE: Final = "-"
    RESTART: Final = "±"


KIND_WORDS: Mapping[str, str] = {
    Action.CREATE: "add",
    Action.CHANGE: "change",
    Action.REMOVE: "remove",
    Action.RESTART: "restart",
}


class Result:
    """What apply did with one Change (ChangeResult.result), as the report, JSON and metrics write it."""

    CHANGED: Final = "changed"
    ALREADY_TRUE: Final = "already-true"
    FAILED: Final = "failed"
    BLOCKED: Final = "blocked"  # something it depends on failed
    CANNOT_FIX: Final = "cannot-fix"  # drift apply only reports
    ALL: Final = (CHANGED, ALREADY_TRUE, FAILED, BLOCKED, CANNOT_FIX)
    FAILURES: Final = (FAILED, BLOCKED, CANNOT_FIX)


class FieldDiff(Record):
    """One field of a resource: `old -> new` (None on a side means absent)."""

    field: str
    old: Any
    new: Any


class Change(Record):
    """One resource that is not as the spec says, and what apply will do about it."""

    resource: str  # "apt", "cuda.home", "venv", "model.files", "model.config", "api_key", "server"
    kind: ChangeKind
    summary: str
    reason: str
    diffs: tuple[FieldDiff, ...] = ()
    depends_on: tuple[str, ...] = ()
    params: Mapping[str, Any] = MappingProxyType({})
    # False when apply cannot fix it (wrong driver, missing GPU): apply reports, never acts.
    actionable: bool = True
    # Not acted on itself, but made true by the change of that resource, which runs first (the headers
    # the [apt] packages bring): counted "to change", and "cannot fix" only if still different after it.
    made_true_by: str | None = None

    @property
    def will_change(self) -> bool:
        return self.actionable or self.made_true_by is not None


class Ok(Record):
    """A resource that already matches the spec, with what was seen."""

    resource: str
    summary: str


class Finding(Record):
    """A preflight rule's verdict: what it looked at, and the fix."""

    rule: str
    severity: Severity
    message: str
    fix: str = ""
    evidence: Mapping[str, Any] = MappingProxyType({})


class ActionResult(Record):
    """What an action did. `changed` is False only with the reason nothing was needed."""

    changed: bool
    message: str


Item = Ok | Change


class Plan(Record):
    """Desired vs observed for one spec: items in dependency order, preflight findings, facts seen."""

    spec_path: str
    host: str
    spec_sha256: str
    git: str
    items: tuple[Item, ...]
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()  # warnings about the run itself (hostname mismatch, dirty spec)
    observed: Mapping[str, Any] = MappingProxyType({})  # JSON-able probe results

    @property
    def changes(self) -> tuple[Change, ...]:
        return tuple(i for i in self.items if isinstance(i, Change))

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def exit_code(self) -> int:
        """0 converged, 2 changes pending, 1 a preflight error blocks apply."""
        if self.errors:
            return 1
        return 2 if self.changes else 0

    @property
    def unfixable(self) -> tuple[Change, ...]:
        """Drift apply only reports (a missing GPU, a driver too old): never counted as "to change"."""
        return tuple(c for c in self.changes if not c.will_change)

    def counts(self) -> dict[str, int]:
        """What apply will change, by kind; `cannot_fix`: the drift it will not touch."""
        out = {word: 0 for word in KIND_WORDS.values()}
        for c in self.changes:
            if c.will_change:
                out[KIND_WORDS[c.kind]] += 1
        out["cannot_fix"] = len(self.unfixable)
        return out
