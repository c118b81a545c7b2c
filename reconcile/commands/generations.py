"""The generation commands: `history`, `diff N M`, `rollback N` and `gc` (the store's realizations)."""

from __future__ import annotations

import contextlib
import sys

from reconcile.commands.common import ask_approval, load_spec, print_report, spec_state_dir
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.commands.common import Args
    from reconcile.spec.loaded import LoadedSpec


def cmd_history(args: Args) -> int:
    from reconcile.apply.history import render_history
    from reconcile.apply.switching import serving_generation
    from reconcile.spec.cache import load
    from reconcile.spec.deployments import chosen, is_multi
    from reconcile.spec.loader import find_spec

    loaded = load(find_spec(args.spec))  # without the lock's pins: a damaged lock must not hide history
    if is_multi(loaded) and getattr(args, "deployment", None) is None:
        from reconcile.commands.machine import render_machine_history

        return render_machine_history(loaded, sys.stdout)
    every = chosen(loaded, getattr(args, "deployment", None))
    codes = []
    for d in every:  # a spec with [deployments]: each one's generations, by name
        if is_multi(loaded):
            sys.stdout.write(f"── deployment {d.name}\n")
        spec = d.loaded.spec
        try:
            now = serving_generation(spec)
        except (OSError, ReconcileError):  # the server cannot be probed: the index's current generation
            now = None
        codes.append(render_history(spec.machine.state_dir, sys.stdout, now))
    return max(codes)


def cmd_diff(args: Args) -> int:
    from reconcile.apply.history import render_diff

    if getattr(args, "deployment", None) is None:
        from reconcile.spec.cache import load
        from reconcile.spec.deployments import is_multi
        from reconcile.spec.loader import find_spec

        loaded = load(find_spec(args.spec))
        if is_multi(loaded):  # the machine's generations
            from reconcile.commands.machine import render_machine_diff

            return render_machine_diff(loaded, args.a, args.b, sys.stdout)
    return render_diff(spec_state_dir(args, one=True), args.a, args.b, sys.stdout)


def cmd_rollback(args: Args) -> int:
    from reconcile.apply import phases
    from reconcile.apply.progress import showing
    from reconcile.apply.rollback import rollback

    phases.begin()

    def ask(old: LoadedSpec, moves: tuple[str, ...] = ()) -> None:  # on a terminal: N's plan, then only `yes`
        ask_approval(args, old, "rollback", moves)

    from reconcile.commands.deployments import one_deployment
    from reconcile.commands.machine import machine_rollback, machine_switch
    from reconcile.spec.deployments import is_multi

    whole = load_spec(args)
    phases.lap("load")
    if is_multi(whole) and getattr(args, "deployment", None) is None:
        return _machine_rollback(args, whole, machine_rollback)
    loaded = one_deployment(args, whole)
    notes: list[str] = []
    switching = (
        machine_switch(whole, f"rollback of {args.deployment}", args.lock_timeout, notes)
        if is_multi(whole)
        else contextlib.nullcontext()
    )
    with showing(sys.stderr, quiet=False) as progress, switching:
        target, report = rollback(
            loaded, args.generation, lock_timeout=args.lock_timeout, progress=progress, approve=ask
        )
    report.notes += notes
    print_report(report, as_json=False, quiet=False)
    done = "rolled back to" if report.exit_code in (0, 2) else "rollback did NOT converge; holding"
    print(f"{done} generation {target}: held until the spec changes or `reconcile resume`")
    return report.exit_code


def _machine_rollback(args: Args, loaded: LoadedSpec, machine_rollback: Any) -> int:
    from reconcile.apply.progress import showing
    from reconcile.commands.deployments import exit_code, print_reports

    with showing(sys.stderr, quiet=False) as progress:
        target, reports = machine_rollback(args, loaded, progress)
    print_reports(reports, as_json=False, quiet=False)
    code = exit_code([r.exit_code for _, r in reports])
    done = "rolled the machine back to" if code in (0, 2) else "machine rollback did NOT converge; holding"
    print(f"{done} machine generation {target}: held until the spec changes or `reconcile resume`")
    return code


def cmd_gc(args: Args) -> int:
    from reconcile.apply.gc import collect
    from reconcile.apply.lock import apply_lock
    from reconcile.apply.store import spec_store
    from reconcile.commands.deployments import one_deployment
    from reconcile.ownership.membership import reconcile_processes
    from reconcile.spec.deployments import deployments, is_multi

    whole = load_spec(args)
    loaded = one_deployment(args, whole)
    spec = loaded.spec
    store = spec_store(spec)
    if store is None:
        print(f"{loaded.path}: [venv] store = false: nothing to collect")
        return 0
    state_dir = spec.machine.state_dir
    own = [p for p in (spec.venv and spec.venv.path, spec.model and spec.model.dir) if p]
    specs = [spec]
    # Several deployments share the store: what each one's generations and spec use is kept, under
    # the machine's apply lock (the one a multi-deployment apply holds), not this deployment's alone.
    lock_dir = state_dir
    others: tuple[tuple[str, str], ...] = ()
    if is_multi(whole):
        lock_dir = whole.spec.machine.state_dir
        every = [d for d in deployments(whole) if d.loaded.spec.machine.state_dir != state_dir]
        others = tuple((d.name, d.loaded.spec.machine.state_dir) for d in every)
        for d in every:
            view = d.loaded.spec
            own += [p for p in (view.venv and view.venv.path, view.model and view.model.dir) if p]
            specs.append(view)
    with apply_lock(lock_dir, timeout=args.lock_timeout):
        # In use: what reconcile's own processes run from (its cgroups and recorded launches), never
        # what a stranger's command line names (it would keep any realization alive).
        running = reconcile_processes(specs)
        done = collect(
            state_dir, store, keep=args.keep, extra_keep=tuple(own), others=others, running=running
        )
    for path, why in sorted(done.kept.items()):
        print(f"  kept     {path}: {why}")
    for path in done.removed:
        print(f"  removed  {path}")
    print(f"{len(done.removed)} realization(s) removed, {done.freed / 2**20:.1f} MiB freed")
    return 0
