"""Terraform's confirmation for `apply` and `rollback`: on a terminal, show the plan and go on only
on `yes`. Called by reconcile.commands; what was approved is what runs (the executor refuses a plan
that moved between the question and the lock).
"""

from __future__ import annotations

import json
import sys

from reconcile.errors import ReconcileError
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

QUESTION = "Do you want to perform these actions? Only 'yes' will be accepted to approve."


def wants_question(args: object, stdin: TextIO | None = None) -> bool:
    """Ask only a person: stdin a terminal, and neither --auto-approve, --scheduled nor --json (`args`:
    the parsed command line, argparse's).
    Without a terminal nobody can answer; apply proceeds as the unattended tool it is (README)."""
    if (
        getattr(args, "auto_approve", False)
        or getattr(args, "scheduled", False)
        or getattr(args, "json", False)
    ):
        return False
    stream = sys.stdin if stdin is None else stdin
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class NotApproved(ReconcileError):
    """The person at the terminal did not say yes: nothing was changed (exit 1)."""


def approve(
    loaded: LoadedSpec,
    *,
    title: str,
    moves: tuple[str, ...] = (),
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> dict[str, Any] | None:
    """Show the plan and ask. Returns the approved plan's fingerprint (for the executor), or None when
    there is nothing to ask about (no change and no profile link to move, or a preflight error that
    makes apply refuse anyway). `moves`: a rollback's profile links (`[venv] path`, `[model] dir`) that
    point elsewhere now, which no plan row shows (the target's realizations already exist). Raises
    NotApproved on any answer but `yes`."""
    from reconcile.apply.saved_plan import fingerprint
    from reconcile.plan.planner import make_plan
    from reconcile.plan.render import render_text

    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    plan = make_plan(loaded)
    if (not plan.changes and not moves) or plan.errors:
        return None
    render_text(plan, out, title=title)
    for move in moves:
        out.write(f"  ~ switch           {move}\n")
    out.write(f"\n{QUESTION}\n\n  Enter a value: ")
    out.flush()
    answer = stdin.readline()
    out.write("\n")
    if answer.strip() != "yes":
        raise NotApproved(f"{title} cancelled: the answer was not `yes`; nothing was changed")
    shown: dict[str, Any] = json.loads(json.dumps(fingerprint(plan), default=str))  # executor shape
    return shown
