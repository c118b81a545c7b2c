"""`reconcile pause` and `reconcile resume`: scheduled applies only plan while paused; resume also
releases a held generation.
"""

from __future__ import annotations

from reconcile.commands.common import spec_state_dir
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
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
    held, hold = resume(state_dir), release_hold(state_dir)
    if held is not None or hold is None:
        print(f"resumed; it was {held.describe()}" if held else "not paused: nothing to resume")
    if hold is not None:
        print(f"released; it was {hold.describe()}: applies follow the spec again")
    return 0
