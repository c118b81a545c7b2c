"""`plan`, `apply` and `status` of a spec with [deployments]: each deployment planned and applied as a
spec of its own (reconcile.spec.deployments) by the same code, under one apply lock for the machine,
after the preflight across them (reconcile.preflight.deployments). Called by reconcile.commands.*.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from reconcile.commands.common import record_run, state_notes, with_hold
from reconcile.plan.records import Finding, Plan
from reconcile.spec.deployments import Deployment, chosen, deployments, is_multi
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

    from reconcile.apply.changes import ApplyReport
    from reconcile.commands.common import Args

MACHINE_SECTIONS = ("gpu", "apt", "cuda")  # rows planned once for the machine, shown with the first


def wanted(args: Args) -> str | None:
    return getattr(args, "deployment", None)


def one_deployment(args: Args, loaded: LoadedSpec) -> LoadedSpec:
    """For the commands that act on one deployment (history, diff, rollback, gc, check, resume): the
    spec itself, or the named deployment of a spec with [deployments] (named, or its only one)."""
    name = wanted(args)
    if not is_multi(loaded):
        if name not in (None, "default"):
            chosen(loaded, name)  # the one-line error naming "default"
        return loaded
    every = views(loaded, name)
    if len(every) > 1:
        from reconcile.errors import ReconcileError

        names = ", ".join(d.name for d in every)
        raise ReconcileError(
            f"{loaded.path} has several deployments ({names}): name one with --deployment NAME"
        )
    return every[0].loaded


def views(loaded: LoadedSpec, name: str | None = None) -> list[Deployment]:
    """The chosen deployments, each at its venv's realization where its [venv] has a store. A deployment's
    state dir that is not a directory (a file, a FIFO, a symlink: a crash, a hand edit) is moved aside
    first, with one line: that deployment's state starts afresh, the others' are untouched."""
    picked = chosen(loaded, name)
    if is_multi(loaded):
        from reconcile.safety import statefiles

        for d in picked:
            statefiles.clear_non_dir(
                d.loaded.spec.machine.state_dir, then=f"deployment {d.name}'s state starts afresh"
            )
    if all(getattr(d.loaded.spec.venv, "store", None) is None for d in picked):
        return picked
    from reconcile.apply.store import realize

    return [d._replace(loaded=realize(d.loaded)) if d.loaded.spec.venv is not None else d for d in picked]


def _ours(every: list[Deployment]) -> set[int]:
    """The pids of every deployment's processes (their GPU memory is not another process's)."""
    from reconcile.ownership.membership import deployment_members, scope_of

    pids: set[int] = set()
    for d in every:
        if d.loaded.spec.server is not None:
            pids |= set(deployment_members(scope_of(d.loaded.spec)))
    return pids


def cross(every: list[Deployment], plans: dict[str, Plan] | None = None) -> list[Finding]:
    """The preflight across deployments, on the GPUs a plan saw (or probed now)."""
    from reconcile.preflight.deployments import cross_findings

    inventory = None
    if every and getattr(every[0].loaded.spec, "gpu", None) is not None:
        from probes.gpu import GpuInventory
        from reconcile.plan.prober import probe_some

        seen = probe_some(every[0].loaded.spec, ("gpu",)).gpu
        inventory = seen if isinstance(seen, GpuInventory) else None
    # Whose GPU memory is ours matters only where NVML lists processes (a /proc scan per deployment).
    return cross_findings(every, inventory, _ours(every) if inventory is not None else set())


def _machine_row(resource: str) -> bool:
    from reconcile.resources import BY_NAME

    return BY_NAME[resource].section in MACHINE_SECTIONS


def plan_all(loaded: LoadedSpec, name: str | None) -> list[tuple[str, Plan]]:
    """Each chosen deployment's plan (a held generation's where one is held); the preflight across all
    of them joins the first. Machine rows are kept only in the first plan."""
    from reconcile.plan.planner import make_plan

    every = deployments(loaded)
    out: list[tuple[str, Plan]] = []
    for n, d in enumerate(views(loaded, name)):
        view, held = with_hold(d.loaded)
        plan = make_plan(view)
        items = plan.items if n == 0 else tuple(i for i in plan.items if not _machine_row(i.resource))
        plan = plan._replace(items=items, notes=(*held, *plan.notes))
        out.append((d.name, plan))
    found = tuple(cross(every))
    first_name, first = out[0]
    out[0] = (first_name, first._replace(findings=(*found, *first.findings)))
    return out


def exit_code(codes: list[int]) -> int:
    """One code for several: an error (1) or a failure (4) wins over changes (2) over nothing (0)."""
    for code in (1, 4, 130, 2):
        if code in codes:
            return code
    return 0


def render_plans(plans: list[tuple[str, Plan]], stream: TextIO, *, as_json: bool, quiet: bool) -> None:
    from reconcile.plan.render import plan_as_data, render_text, summary_line

    if as_json:
        import json

        data = {
            "exit_code": exit_code([p.exit_code for _, p in plans]),
            "deployments": {name: plan_as_data(p) for name, p in plans},
        }
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
        return
    for name, plan in plans:
        if quiet and plan.exit_code == 0:
            stream.write(f"reconcile: {plan.spec_path} [{name}]: {summary_line(plan)}\n")
        else:
            render_text(plan, stream, title=f"plan [deployment {name}]")
            stream.write("\n")


def cmd_plan_all(args: Args, loaded: LoadedSpec) -> int:
    started = time.time()
    plans = plan_all(loaded, wanted(args))
    if getattr(args, "out", None):
        from reconcile.errors import ReconcileError

        raise ReconcileError("plan --out: a spec with [deployments] has no plan file yet (apply it directly)")
    if getattr(args, "scheduled", False) or getattr(args, "textfile", None):
        record_runs(args, "plan", started, [(name, p.exit_code, p, None) for name, p in plans], loaded)
    notes = state_notes()
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    render_plans(plans, sys.stdout, as_json=args.json, quiet=args.quiet)
    return exit_code([p.exit_code for _, p in plans])


def apply_all(args: Args, loaded: LoadedSpec, progress: Any) -> list[tuple[str, ApplyReport]]:
    """Under the machine's apply lock: the preflight across deployments, then each chosen deployment
    applied as a spec of its own (its own lock, generations and records inside its state subdir)."""
    from reconcile.apply.changes import ApplyReport
    from reconcile.apply.executor import apply
    from reconcile.apply.lock import apply_lock
    from reconcile.plan.planner import make_plan
    from reconcile.unattended.pause import read_pause

    every = deployments(loaded)
    picked = views(loaded, wanted(args))
    machine_dir = loaded.spec.machine.state_dir
    scheduled = bool(getattr(args, "scheduled", False))
    out: list[tuple[str, ApplyReport]] = []
    paused = read_pause(machine_dir)
    if paused is not None and scheduled:  # the machine's pause holds every deployment
        for d in picked:
            report = ApplyReport(d.loaded.path, paused=paused)
            report.first_plan = report.final_plan = make_plan(d.loaded)
            out.append((d.name, report))
        return out

    def waiting(holder: str) -> None:
        progress(f"waiting up to {args.lock_timeout:g}s for the machine's apply lock, held by {holder}")

    with apply_lock(machine_dir, timeout=args.lock_timeout, on_wait=waiting):
        errors = [f for f in cross(every) if f.severity == "error"]
        if errors:
            for d in picked:
                plan = make_plan(d.loaded)
                plan = plan._replace(findings=(*errors, *plan.findings))
                refused = ApplyReport(d.loaded.path, first_plan=plan, final_plan=plan)
                refused.refused = f"{len(errors)} preflight error(s) across deployments; nothing was changed"
                out.append((d.name, refused))
            return out
        notes: list[str] = []
        try:
            for d in picked:
                progress(f"deployment {d.name}")
                report = apply(
                    d.loaded,
                    lock_timeout=args.lock_timeout,
                    scheduled=scheduled,
                    auto_rollback=not getattr(args, "no_auto_rollback", False),
                    progress=progress,
                )
                if paused is not None:
                    report.notes.append(f"scheduled applies are {paused.describe()}; this apply runs anyway")
                out.append((d.name, report))
        finally:  # the machine's generation: every deployment as this apply left it
            from reconcile.commands.machine import record_machine

            record_machine(loaded, "apply", notes)
        if out:
            out[-1][1].notes.extend(notes)
    return out


def print_reports(reports: list[tuple[str, ApplyReport]], *, as_json: bool, quiet: bool) -> None:
    from reconcile.apply.changes import render_report

    if as_json:
        import json

        from reconcile.plan.jsondata import apply_as_data

        data = {
            "exit_code": exit_code([r.exit_code for _, r in reports]),
            "changed": any(r.changed for _, r in reports),
            "deployments": {name: apply_as_data(r) for name, r in reports},
        }
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    for name, report in reports:
        sys.stdout.write(f"── deployment {name}\n")
        render_report(report, sys.stdout, as_json=False, quiet=quiet)


def record_runs(
    args: Args,
    command: str,
    started: float,
    runs: Sequence[tuple[str, int, Plan | None, ApplyReport | None]],
    loaded: LoadedSpec,
) -> None:
    """last-run.json in each deployment's state subdir (with its name), one for the machine listing
    them, and one textfile with every metric labelled by deployment."""
    from reconcile.unattended.metrics import write_textfile
    from reconcile.unattended.report import RunFacts, report_run

    views = {d.name: d.loaded for d in deployments(loaded)}
    records = []
    finished = time.time()
    for name, code, plan, report in runs:
        view = views[name]
        facts = RunFacts(
            command,
            bool(getattr(args, "scheduled", False)),
            started,
            finished,
            code,
            loaded.path,
            loaded=view,
            plan=report.final_plan if report is not None else plan,
            first_plan=report.first_plan if report is not None else None,
            report=report,
            paused=report.paused if report is not None else None,
            server_wanted=view.spec.server is not None,
            extra={"deployment": name},
        )
        records.append(report_run(facts, None))
    summary = {
        r["deployment"]: {
            k: r[k] for k in ("outcome", "exit_code", "converged", "server_healthy", "generation")
        }
        for r in records
    }
    from reconcile.apply.machine_generations import current

    extra = {"deployments": summary, "machine_generation": current(loaded.spec.machine.state_dir)}
    record_run(args, command, started, exit_code([c for _, c, _, _ in runs]), loaded, extra=extra)
    textfile = getattr(args, "textfile", None)
    if textfile:
        write_textfile(textfile, records)


def cmd_apply_all(args: Args, loaded: LoadedSpec) -> int:
    from reconcile.apply.progress import showing

    if getattr(args, "planfile", None):
        from reconcile.errors import ReconcileError

        raise ReconcileError("apply FILE: a spec with [deployments] has no plan file yet (apply it directly)")
    started = time.time()
    if getattr(args, "reset_crash_loop", False):
        from actions.launching import reset_crash_loop

        for d in chosen(loaded, wanted(args)):
            print(f"crash-loop guard [{d.name}]: {reset_crash_loop(d.loaded.spec).message}", file=sys.stderr)
    _approve(args, loaded)
    with showing(sys.stderr, quiet=args.quiet) as progress:
        reports = apply_all(args, loaded, progress)
    for note in state_notes():
        reports[0][1].notes.insert(0, note)
    print_reports(reports, as_json=args.json, quiet=args.quiet)
    runs = [(name, r.exit_code, None, r) for name, r in reports]
    record_runs(args, "apply", started, runs, loaded)
    return exit_code([r.exit_code for _, r in reports])


def _approve(args: Args, loaded: LoadedSpec) -> None:
    """On a terminal: every deployment's plan shown, and a `yes` (the plans are made again under the lock)."""
    from reconcile.apply.approval import QUESTION, NotApproved, wants_question

    if not wants_question(args):
        return
    plans = plan_all(loaded, wanted(args))
    if not any(p.changes for _, p in plans) or any(p.errors for _, p in plans):
        return
    render_plans(plans, sys.stdout, as_json=False, quiet=False)
    sys.stdout.write(f"\n{QUESTION}\n\n  Enter a value: ")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "yes":
        raise NotApproved("apply cancelled: the answer was not `yes`; nothing was changed")


def status_all(args: Args, loaded: LoadedSpec, stream: TextIO) -> int:
    from reconcile.commands.status import render_status, status_as_data, status_of

    reports = []
    for d in views(loaded, wanted(args)):
        view, held = with_hold(d.loaded)
        reports.append((d.name, status_of(view), held))
    from reconcile.unattended.pause import read_pause

    machine = read_pause(loaded.spec.machine.state_dir)  # the machine's pause holds every deployment
    for _, report, _ in reports:
        if report.pause is None and machine is not None:
            report.pause = machine.as_data() | {"text": machine.describe()}
    found = [f for f in cross(deployments(loaded)) if f.severity != "info"]
    for f in found:
        reports[0][1].findings.insert(0, {"rule": f.rule, "severity": f.severity, "message": f.message})
    code = exit_code([r.exit_code for _, r, _ in reports])
    if args.json:
        import json

        data = {"exit_code": code, "deployments": {n: status_as_data(r) for n, r, _ in reports}}
        json.dump(data, stream, indent=2, default=str)
        stream.write("\n")
        return code
    for name, report, held in reports:
        stream.write(f"── deployment {name}\n")
        render_status(report, stream, as_json=False, notes=held)
        stream.write("\n")
    return code


def check_all(args: Args, loaded: LoadedSpec, stream: TextIO) -> int:
    from reconcile.commands.status import run_check

    codes = []
    for d in views(loaded, wanted(args)):
        stream.write(f"── deployment {d.name}\n")
        codes.append(run_check(with_hold(d.loaded)[0], stream))
    return 1 if any(codes) else 0
