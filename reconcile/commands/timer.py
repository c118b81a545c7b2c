"""`reconcile timer install|cron|remove`: the scheduled apply as systemd units or a cron line."""

from __future__ import annotations

import os
import sys

from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


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
        server_stop=loaded.spec.server.stop_timeout if loaded.spec.server is not None else 0.0,
    )
    if args.timer_command == "cron":
        # The line's shell makes, locks and appends to files in the state dir by name, as root, before
        # apply walks it: the dir is made (or found root's, 0700) here, through the trust walk, so no
        # other user has chosen where those files go.
        from reconcile.safety.filesafety import PRIVATE_DIR, ensure_dir

        ensure_dir(schedule.state_dir, PRIVATE_DIR)
        sys.stdout.write(scheduling.render_cron(schedule))
        return 0
    done = scheduling.install(schedule, args.unit_dir)
    print(f"{'wrote' if done.changed else 'unchanged'}: {', '.join(done.paths)}")
    print(f"enabled and started {schedule.timer_name}" if done.activated else done.next_steps)
    return 0
