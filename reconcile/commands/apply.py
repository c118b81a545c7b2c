"""`reconcile apply [FILE]`: the spec (or a saved plan) made true; the run reported."""

from __future__ import annotations

import contextlib
import sys
import time
from types import SimpleNamespace

from reconcile.commands.common import (
    ask_approval,
    load_spec,
    print_report,
    record_failure,
    record_run,
    state_notes,
)
from reconcile.errors import ReconcileError
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


def cmd_apply(args: Args) -> int:
    from reconcile.apply import phases
    from reconcile.apply.executor import apply, apply_saved
    from reconcile.apply.progress import showing

    phases.begin()
    started = time.time()
    loaded: LoadedSpec | None = None
    try:
        if args.planfile:
            with showing(sys.stderr, quiet=args.quiet) as progress:
                report = apply_saved(args.planfile, lock_timeout=args.lock_timeout, progress=progress)
        else:
            loaded = load_spec(args)
            phases.lap("load")
            if getattr(loaded.spec, "deployments", None) or getattr(args, "deployment", None):
                from reconcile.commands.deployments import cmd_apply_all

                return cmd_apply_all(args, loaded)
            if getattr(args, "reset_crash_loop", False) and loaded.spec.server is not None:
                from actions.launching import reset_crash_loop

                print(f"crash-loop guard: {reset_crash_loop(loaded.spec).message}", file=sys.stderr)
            approved = ask_approval(args, loaded, "apply")
            with showing(sys.stderr, quiet=args.quiet) as progress:
                report = apply(
                    loaded,
                    lock_timeout=args.lock_timeout,
                    scheduled=getattr(args, "scheduled", False),
                    auto_rollback=not getattr(args, "no_auto_rollback", False),
                    expected=approved,
                    progress=progress,
                )
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: exit 130; monitoring must not read "converged"
        from reconcile.unattended.report import INTERRUPTED

        left = str(exc)  # a switch says what it left (reconcile.apply.switching.SwitchInterrupted)
        error = f"{INTERRUPTED}; {left}" if left and left != "SIGTERM" else INTERRUPTED
        with contextlib.suppress(ReconcileError, OSError):
            record_run(args, "apply", started, 130, loaded, error=error)
        raise
    except ReconcileError as exc:  # a bad spec, a lock held too long: still reported, then raised
        from reconcile.apply.approval import NotApproved

        if not isinstance(exc, NotApproved):  # a person said no at the terminal: no run to report
            record_failure(args, "apply", started, loaded, exc)
        if args.json:  # Ansible and scripts read one document on stdout whatever happened
            from reconcile.apply.changes import ApplyReport

            failed = ApplyReport(getattr(args, "spec", None) or args.planfile or "", refused=str(exc))
            print_report(failed, as_json=True, quiet=False)
        raise
    report.notes[:0] = state_notes()
    print_report(report, as_json=args.json, quiet=args.quiet)
    if loaded is None:  # a plan file names its spec
        with contextlib.suppress(ReconcileError, OSError):
            loaded = load_spec(SimpleNamespace(spec=report.spec_path))
    record_run(
        args,
        "apply",
        started,
        report.exit_code,
        loaded,
        report=report,
        first_plan=report.first_plan,
        plan=report.final_plan,
        paused=report.paused,
    )
    return report.exit_code
