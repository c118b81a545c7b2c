"""What every resource module shares: the planner and action signatures, and the plan item for a
probe that could not look. Imported by reconcile.resources.* only.
"""

from __future__ import annotations

from collections.abc import Callable

from probes.common import ProbeFailure, Unavailable
from reconcile.plan.records import Change

Progress = Callable[[str], None]


def failed(resource: str, result: object, section: str) -> Change | None:
    """A probe that could not look: a drift apply cannot fix, with the probe's reason."""
    if isinstance(result, (ProbeFailure, Unavailable)):
        return Change(
            resource,
            "~",
            f"cannot be checked: {result.reason}",
            f"the {section} probe failed",
            actionable=False,
        )
    return None


def giB(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"
