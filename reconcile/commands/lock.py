"""`reconcile lock`: the lock file that pins what floats in the spec."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


def cmd_lock(args: Args) -> int:
    from reconcile.authoring.lockfile import make_lock
    from reconcile.spec.cache import load
    from reconcile.spec.loader import find_spec

    result = make_lock(load(find_spec(args.spec)))  # the spec as written: what floats there
    for line in result.lines:
        print(f"  {line}")
    if not result.lines:
        print("nothing floats: every package is ==pinned and the model revision is a commit")
    print(f"{'wrote' if result.changed else 'unchanged'}: {result.path}")
    return 2 if result.changed else 0
