"""The generation commands: `history`, `diff N M`, `rollback N` and `gc` (the store's realizations)."""

from __future__ import annotations

import sys

from reconcile.commands.common import ask_approval, load_spec, print_report, spec_state_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args
    from reconcile.spec.loaded import LoadedSpec


def cmd_history(args: Args) -> int:
    from reconcile.apply.history import render_history

    if getattr(args, "deployment", None) is None:
        every = _every_deployment(args)
        if every is not None:  # a spec with [deployments]: each one's generations, by name
            codes = []
            for name, state_dir in every:
                sys.stdout.write(f"── deployment {name}\n")
                codes.append(render_history(state_dir, sys.stdout))
            return max(codes)
    return render_history(spec_state_dir(args, one=True), sys.stdout)


def _every_deployment(args: Args) -> list[tuple[str, str]] | None:
    from reconcile.spec.cache import load
    from reconcile.spec.loaded import find_spec

    loaded = load(find_spec(args.spec))
    if not getattr(loaded.spec, "deployments", None):
        return None
    from reconcile.spec.deployments import deployments

    return [(d.name, d.loaded.spec.machine.state_dir) for d in deployments(loaded)]


def cmd_diff(args: Args) -> int:
    from reconcile.apply.history import render_diff

    return render_diff(spec_state_dir(args, one=True), args.a, args.b, sys.stdout)


def cmd_rollback(args: Args) -> int:
    from reconcile.apply.progress import showing
    from reconcile.apply.switching import rollback

    def ask(old: LoadedSpec) -> None:  # on a terminal: generation N's plan shown, then only `yes`
        ask_approval(args, old, "rollback")

    from reconcile.commands.deployments import one_deployment

    loaded = one_deployment(args, load_spec(args))
    with showing(sys.stderr, quiet=False) as progress:
        target, report = rollback(
            loaded, args.generation, lock_timeout=args.lock_timeout, progress=progress, approve=ask
        )
    print_report(report, as_json=False, quiet=False)
    done = "rolled back to" if report.exit_code in (0, 2) else "rollback did NOT converge; holding"
    print(f"{done} generation {target}: held until the spec changes or `reconcile resume`")
    return report.exit_code


def cmd_gc(args: Args) -> int:
    from reconcile.apply.gc import collect
    from reconcile.apply.lock import apply_lock
    from reconcile.apply.store import store_of
    from reconcile.commands.deployments import one_deployment

    loaded = one_deployment(args, load_spec(args))
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
