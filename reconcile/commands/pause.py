"""`reconcile pause` and `reconcile resume`: scheduled applies only plan while paused; resume also
releases a held generation.
"""

from __future__ import annotations

from reconcile.commands.common import spec_state_dir
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.commands.common import Args


def cmd_pause(args: Args) -> int:
    from reconcile.spec.values import parse_duration
    from reconcile.unattended.pause import pause

    try:
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise ReconcileError(f"--for: {exc}") from None
    new, old = pause(spec_state_dir(args), args.reason, duration=duration)
    if old is not None:
        print(f"replaces: {old.describe()}")
    print(
        f"{new.describe()}\nscheduled applies only plan until `reconcile resume`"
        + (" or the pause ends" if duration else "")
    )
    return 0


def cmd_resume(args: Args) -> int:
    from reconcile.apply.generations import release_hold
    from reconcile.unattended.pause import resume

    state_dir = spec_state_dir(args)
    held = resume(state_dir)
    holds = [("", release_hold(state_dir)), *_deployment_holds(args, release_hold)]
    released = [(name, hold) for name, hold in holds if hold is not None]
    if held is not None or not released:
        print(f"resumed; it was {held.describe()}" if held else "not paused: nothing to resume")
    for name, hold in released:
        print(f"released{name}; it was {hold.describe()}: applies follow the spec again")
    return 0


def _deployment_holds(args: Args, release: Any) -> list[tuple[str, Any]]:
    """Without --deployment, a spec with [deployments]: every deployment's hold (a machine rollback's)."""
    if getattr(args, "deployment", None) is not None:
        return []
    from reconcile.spec.cache import load
    from reconcile.spec.deployments import deployments, is_multi
    from reconcile.spec.loader import find_spec

    loaded = load(find_spec(args.spec))
    if not is_multi(loaded):
        return []
    return [(f" [{d.name}]", release(d.loaded.spec.machine.state_dir)) for d in deployments(loaded)]
