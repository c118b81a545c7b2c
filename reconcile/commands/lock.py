"""`reconcile lock`: the lock file that pins what floats in the spec."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args
    from reconcile.spec.loaded import LoadedSpec


def cmd_lock(args: Args) -> int:
    import sys

    from reconcile.authoring.lockfile import make_lock
    from reconcile.spec.cache import load
    from reconcile.spec.loader import find_spec

    loaded = load(find_spec(args.spec))  # the spec as written: what floats there
    result = make_lock(loaded)
    for line in result.lines:
        print(f"  {line}")
    unlocked = not_locked(loaded)
    for line in unlocked:
        print(f"note: {line}", file=sys.stderr)
    if not result.lines:
        where = " in the machine's sections" if unlocked else ""
        print(f"nothing floats{where}: every package is ==pinned and the model revision is a commit")
    print(f"{'wrote' if result.changed else 'unchanged'}: {result.path}")
    return 2 if result.changed else 0


def not_locked(loaded: LoadedSpec) -> list[str]:
    """What floats in a deployment's own sections, which the lock does not pin yet (it pins the
    machine's [venv] and top-level sections): said, never silently left floating."""
    from reconcile.spec.pins import floating_model, floating_packages

    out = []
    for name, table in (getattr(loaded.spec, "deployments", None) or {}).items():
        own = table.venv is not None and floating_packages(
            loaded.spec.model_copy(update={"venv": table.venv})
        )
        model = floating_model(loaded.spec.model_copy(update={"model": table.model}))
        what = [f"deployments.{name}.venv" if own else "", f"deployments.{name}.model" if model else ""]
        for section in filter(None, what):
            out.append(
                f"{section} floats: `reconcile lock` does not pin a deployment's own sections yet "
                "(pin its packages with == and its model revision with a commit)"
            )
    return out
