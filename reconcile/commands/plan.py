"""`reconcile plan`: the plan of the spec (or of the held generation), as text, JSON or one line."""

from __future__ import annotations

import sys
import time

from reconcile.commands.common import load_spec, record_failure, record_run, state_notes, with_hold
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


def cmd_plan(args: Args) -> int:
    from reconcile.plan.planner import make_plan
    from reconcile.plan.render import render_json, render_text, summary_line

    scheduled, textfile = getattr(args, "scheduled", False), getattr(args, "textfile", None)
    started, reported = time.time(), scheduled or textfile
    try:
        loaded = load_spec(args)
    except ReconcileError as exc:
        if reported:
            record_failure(args, "plan", started, None, exc)
        raise
    if getattr(loaded.spec, "deployments", None) or getattr(args, "deployment", None):
        from reconcile.commands.deployments import cmd_plan_all

        return cmd_plan_all(args, loaded)
    loaded, held = with_hold(loaded)
    plan = make_plan(loaded)
    if held:
        plan = plan._replace(notes=(*held, *plan.notes))
    if reported:
        record_run(args, "plan", started, plan.exit_code, loaded, plan=plan)
    plan = plan._replace(notes=(*state_notes(), *plan.notes))
    if args.out:
        from reconcile.apply.saved_plan import save_plan

        save_plan(plan, loaded, args.out)
    if args.json:
        render_json(plan, sys.stdout)
    elif args.quiet and plan.exit_code == 0:
        print(f"reconcile: {plan.spec_path}: {summary_line(plan)}")
    else:
        render_text(plan, sys.stdout)
    return plan.exit_code
