"""One function per CLI command: load the spec, call the core, render, return the exit code.

Called only by `reconcile.cli`; kept apart so that `reconcile --help` imports none of this.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from types import SimpleNamespace

from reconcile.errors import ReconcileError
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    Args = argparse.Namespace | SimpleNamespace  # argparse's, or one made here (the report's spec)


def _load(args: Args) -> LoadedSpec:
    from reconcile.spec.cache import load
    from reconcile.spec.loaded import find_spec
    from reconcile.spec.pins import apply_lock_pins

    # The lock's pins (specs/<name>.lock) are the desired state wherever the spec is read; with
    # [venv] store, the venv is its realization's content-addressed path.
    loaded = apply_lock_pins(load(find_spec(getattr(args, "spec", None))))
    if getattr(loaded.spec.venv, "store", None) is None:  # realizing's hashlib and shutil: stores only
        return loaded
    from reconcile.apply.store import realize

    return realize(loaded)


def _held(loaded: LoadedSpec) -> tuple[LoadedSpec, list[str]]:
    """The spec a scheduled apply would apply now (a held generation's), and the hold's note."""
    from reconcile.apply.generations import read_hold

    if read_hold(loaded.spec.machine.state_dir) is None:  # one small read when nothing is held
        return loaded, []
    from reconcile.apply.switching import held_spec

    held, notes, _ = held_spec(loaded, scheduled=True)
    return held, notes


def cmd_plan(args: Args) -> int:
    from reconcile.plan.planner import make_plan
    from reconcile.plan.render import render_json, render_text, summary_line

    scheduled, textfile = getattr(args, "scheduled", False), getattr(args, "textfile", None)
    started, reported = time.time(), scheduled or textfile
    try:
        loaded = _load(args)
    except ReconcileError as exc:
        if reported:
            _report_failure(args, "plan", started, None, exc)
        raise
    loaded, held = _held(loaded)
    plan = make_plan(loaded)
    if held:
        plan = plan._replace(notes=(*held, *plan.notes))
    if reported:
        _report(args, "plan", started, plan.exit_code, loaded, plan=plan)
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


def cmd_apply(args: Args) -> int:
    from reconcile.apply.executor import apply_plan_file
    from reconcile.apply.progress import showing
    from reconcile.apply.switching import apply

    started = time.time()
    loaded: LoadedSpec | None = None
    try:
        if args.planfile:
            report = apply_plan_file(args.planfile, lock_timeout=args.lock_timeout)
        else:
            loaded = _load(args)
            if getattr(args, "reset_crash_loop", False) and loaded.spec.server is not None:
                from actions.launching import reset_crash_loop

                print(f"crash-loop guard: {reset_crash_loop(loaded.spec).message}", file=sys.stderr)
            approved = _approved(args, loaded, "apply")
            with showing(sys.stderr, quiet=args.quiet) as progress:
                report = apply(
                    loaded,
                    lock_timeout=args.lock_timeout,
                    scheduled=getattr(args, "scheduled", False),
                    auto_rollback=not getattr(args, "no_auto_rollback", False),
                    expected=approved,
                    progress=progress,
                )
    except KeyboardInterrupt:  # Ctrl-C: exit 130; monitoring must not go on reading "converged"
        from reconcile.unattended.report import INTERRUPTED

        with contextlib.suppress(ReconcileError, OSError):
            _report(args, "apply", started, 130, loaded, error=INTERRUPTED)
        raise
    except ReconcileError as exc:  # a bad spec, a lock held too long: still reported, then raised
        from reconcile.apply.approval import NotApproved

        if not isinstance(exc, NotApproved):  # a person said no at the terminal: no run to report
            _report_failure(args, "apply", started, loaded, exc)
        if args.json:  # Ansible and scripts read one document on stdout whatever happened
            from reconcile.apply.executor import ApplyReport

            failed = ApplyReport(getattr(args, "spec", None) or args.planfile or "", refused=str(exc))
            _print_report(failed, as_json=True, quiet=False)
        raise
    _print_report(report, as_json=args.json, quiet=args.quiet)
    if loaded is None:  # a plan file names its spec
        with contextlib.suppress(ReconcileError, OSError):
            loaded = _load(SimpleNamespace(spec=report.spec_path))
    _report(
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


def _print_report(report: Any, *, as_json: bool, quiet: bool) -> None:
    """The apply report on stdout; in colour on a terminal (NO_COLOR and TERM=dumb respected)."""
    import io

    from reconcile.apply.executor import render_report
    from reconcile.plan.render import paint_report, use_colour

    if as_json or not use_colour(sys.stdout):
        render_report(report, sys.stdout, as_json=as_json, quiet=quiet)
        return
    text = io.StringIO()
    render_report(report, text, as_json=False, quiet=quiet)
    sys.stdout.write(paint_report(text.getvalue()))


def _approved(args: Args, loaded: LoadedSpec, title: str) -> dict[str, Any] | None:
    """On a terminal (and without --auto-approve): the plan shown and a `yes`, or NotApproved."""
    from reconcile.apply.approval import approve, wants_question

    return approve(loaded, title=title) if wants_question(args) else None


def _report_failure(
    args: Args, command: str, started: float, loaded: LoadedSpec | None, exc: ReconcileError
) -> None:
    with contextlib.suppress(ReconcileError, OSError):
        _report(args, command, started, 1, loaded, error=str(exc))


def _report(
    args: Args,
    command: str,
    started: float,
    exit_code: int,
    loaded: LoadedSpec | None,
    **facts: Any,
) -> None:
    """last-run.json under the spec's state_dir (every apply; a plan when --scheduled or --textfile)
    and the Prometheus textfile when --textfile is given."""
    from reconcile.unattended.report import RunFacts, report_run

    path = loaded.path if loaded is not None else (getattr(args, "spec", None) or "")
    server = loaded is not None and loaded.spec.server is not None
    run = RunFacts(
        command,
        bool(getattr(args, "scheduled", False)),
        started,
        time.time(),
        exit_code,
        path,
        loaded=loaded,
        server_wanted=server,
        **facts,
    )
    try:
        report_run(run, getattr(args, "textfile", None))
    except OSError as exc:  # the run's own outcome stands; a stale report is what monitoring alerts on
        print(f"reconcile: warning: could not write the run report: {exc}", file=sys.stderr)


def cmd_status(args: Args) -> int:
    from reconcile.plan.status import render_status, status_of

    loaded, held = _held(_load(args))
    report = status_of(loaded)
    render_status(report, sys.stdout, as_json=args.json, notes=held)
    return report.exit_code


def cmd_check(args: Args) -> int:
    from reconcile.plan.status import run_check

    return run_check(_held(_load(args))[0], sys.stdout)


def cmd_history(args: Args) -> int:
    from reconcile.apply.history import render_history

    return render_history(_state_dir(args), sys.stdout)


def cmd_diff(args: Args) -> int:
    from reconcile.apply.history import render_diff

    return render_diff(_state_dir(args), args.a, args.b, sys.stdout)


def cmd_rollback(args: Args) -> int:
    from reconcile.apply.progress import showing
    from reconcile.apply.switching import rollback

    def ask(old: LoadedSpec) -> None:  # on a terminal: generation N's plan shown, then only `yes`
        _approved(args, old, "rollback")

    loaded = _load(args)
    with showing(sys.stderr, quiet=False) as progress:
        target, report = rollback(
            loaded, args.generation, lock_timeout=args.lock_timeout, progress=progress, approve=ask
        )
    _print_report(report, as_json=False, quiet=False)
    done = "rolled back to" if report.exit_code in (0, 2) else "rollback did NOT converge; holding"
    print(f"{done} generation {target}: held until the spec changes or `reconcile resume`")
    return report.exit_code


def cmd_gc(args: Args) -> int:
    from reconcile.apply.gc import collect
    from reconcile.apply.lock import apply_lock
    from reconcile.apply.store import store_of

    loaded = _load(args)
    store = store_of(loaded.spec.venv)
    if store is None or loaded.spec.venv is None:
        print(f"{loaded.path}: no [venv] store: nothing to collect")
        return 0
    state_dir = loaded.spec.machine.state_dir
    with apply_lock(state_dir, timeout=args.lock_timeout):
        done = collect(state_dir, store, keep=args.keep, extra_keep=(loaded.spec.venv.path,))
    for path, why in sorted(done.kept.items()):
        print(f"  kept     {path}: {why}")
    for path in done.removed:
        print(f"  removed  {path}")
    print(f"{len(done.removed)} realization(s) removed, {done.freed / 2**20:.1f} MiB freed")
    return 0


def cmd_schema(args: Args) -> int:
    if getattr(args, "json", False):
        import json

        from reconcile.plan.jsondata import spec_json_schema

        json.dump(spec_json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from reconcile.spec.loader import schema_text

    print(schema_text())
    return 0


def cmd_timer(args: Args) -> int:
    from reconcile.unattended import timer as scheduling

    if args.timer_command == "remove":
        gone = scheduling.remove(args.name, args.unit_dir)
        said = (
            f"removed {', '.join(gone.paths)}" if gone.paths else f"no {args.name} units in {args.unit_dir}"
        )
        print("\n".join(filter(None, (said, gone.next_steps))))
        return 0
    from reconcile.spec.loader import find_spec, load_spec
    from reconcile.spec.values import parse_duration

    path = os.path.abspath(find_spec(args.spec))
    loaded = load_spec(path)  # a timer for a spec that does not load would only fail every tick
    every = scheduling.parse_every(args.every)
    try:
        given = args.randomized_delay
        delay = None if given is None else 0 if given.strip() in ("0", "0s") else round(parse_duration(given))
    except ValueError as exc:
        raise ReconcileError(f"--randomized-delay: {exc}") from None
    schedule = scheduling.Schedule(
        path,
        loaded.spec.machine.state_dir,
        every,
        scheduling.default_delay(every) if delay is None else delay,
        lock_timeout=args.lock_timeout,
        textfile=os.path.abspath(args.textfile) if args.textfile else None,
        name=args.name,
    )
    if args.timer_command == "cron":
        sys.stdout.write(scheduling.render_cron(schedule))
        return 0
    done = scheduling.install(schedule, args.unit_dir)
    print(f"{'wrote' if done.changed else 'unchanged'}: {', '.join(done.paths)}")
    print(f"enabled and started {schedule.timer_name}" if done.activated else done.next_steps)
    return 0


def cmd_pause(args: Args) -> int:
    from reconcile.spec.values import parse_duration
    from reconcile.unattended.pause import pause

    try:
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise ReconcileError(f"--for: {exc}") from None
    new, old = pause(_state_dir(args), args.reason, duration=duration)
    if old is not None:
        print(f"replaces: {old.describe()}")
    print(
        f"{new.describe()}\nscheduled applies only plan until `reconcile resume`"
        + (" or the pause ends" if duration else "")
    )
    return 0


def _state_dir(args: Args) -> str:
    """The spec's state_dir, without the lock: a damaged lock must not keep a person from pausing."""
    from reconcile.spec.cache import load
    from reconcile.spec.loader import find_spec

    return load(find_spec(args.spec)).spec.machine.state_dir


def cmd_resume(args: Args) -> int:
    from reconcile.apply.generations import release_hold
    from reconcile.unattended.pause import resume

    state_dir = _state_dir(args)
    held, hold = resume(state_dir), release_hold(state_dir)
    if held is not None or hold is None:
        print(f"resumed; it was {held.describe()}" if held else "not paused: nothing to resume")
    if hold is not None:
        print(f"released; it was {hold.describe()}: applies follow the spec again")
    return 0


def cmd_init(args: Args) -> int:
    from reconcile.unattended.init_draft import render_spec
    from reconcile.unattended.init_survey import default_path, probe_machine, write_spec

    facts = probe_machine(pid=args.pid)
    text = render_spec(facts, state_dir=args.state_dir, manage_server=args.manage_server)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = args.out or default_path(facts.hostname)
    write_spec(out, text, force=args.force)
    found = [s for s in ("gpu", "cuda", "apt", "venv", "server") if f"\n[{s}]" in text]
    print(
        f"wrote {out}: {', '.join(found) or 'only [machine]'}"
        + (
            f"; a running server (pid {facts.server.pid}) is written commented out"
            if facts.server and not args.manage_server
            else ""
        )
    )
    print(f"next: reconcile plan --spec {out}")
    return 0


def cmd_lock(args: Args) -> int:
    from reconcile.spec.cache import load
    from reconcile.spec.loader import find_spec
    from reconcile.unattended.lockfile import make_lock

    result = make_lock(load(find_spec(args.spec)))  # the spec as written: what floats there
    for line in result.lines:
        print(f"  {line}")
    if not result.lines:
        print("nothing floats: every package is ==pinned and the model revision is a commit")
    print(f"{'wrote' if result.changed else 'unchanged'}: {result.path}")
    return 2 if result.changed else 0


def cmd_validate(args: Args) -> int:
    from reconcile.preflight.offline import render, validate_dir

    return render(validate_dir(args.directory), sys.stdout, strict=args.strict)
