"""`reconcile init`: a first spec drafted from what this machine has."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


def cmd_init(args: Args) -> int:
    from reconcile.authoring.init_draft import render_spec
    from reconcile.authoring.init_survey import default_path, probe_machine, write_spec

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
