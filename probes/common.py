"""Result types shared by every probe: Unavailable, ProbeFailure, Absent, Invalid, and ParseError.

Probes return these instead of None or an exception, so the planner can tell "not there" from
"could not look" from "looked and did not understand". Imported by probes/* and reconcile.plan.prober.
"""

from __future__ import annotations

from reconcile.record import Record


class Unavailable(Record):
    """The probe could not look: the tool or library it needs is missing (reason says which, and why)."""

    reason: str
    raw: str = ""


class ProbeFailure(Record):
    """The probe looked but failed: output it cannot parse, a command that failed, or a crash."""

    reason: str
    raw: str = ""


class Absent(Record):
    """The file or directory is not there (a state, not a failure)."""

    path: str


class Invalid(Record):
    """The file is there but cannot be understood; `message` says why, `raw` is what was read."""

    path: str
    message: str
    raw: str = ""


class ParseError(ValueError):
    """Raised by the pure parsers: the text did not have the expected shape. Carries the text."""

    def __init__(self, message: str, raw: str) -> None:
        super().__init__(message)
        self.message = message
        self.raw = raw

    def as_failure(self, what: str) -> ProbeFailure:
        return ProbeFailure(f"{what}: {self.message}", self.raw)
