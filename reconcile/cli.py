"""The `reconcile` command line. Parses arguments, calls the core, maps outcomes to exit codes.

argparse (stdlib) rather than click/typer: it adds nothing to start-up time, and a converged
`reconcile plan` must feel instant. Every user-facing error is one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reconcile import __version__
from reconcile.errors import ReconcileError

EXIT_DOC = """exit codes:
  plan:  0 converged, 2 changes pending, 1 error (bad spec, preflight error)
  apply: 0 nothing to do (or paused, with --scheduled), 2 changes made and converged, 1 error before
         any change (bad spec, preflight error, lock timeout), 4 a change failed, not converged, or a
         switch failed readiness or the acceptance check (then rolled back to the last good one)
  lock:  0 the lock already held these pins, 2 the lock was written"""


def _add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", metavar="PATH", help="spec file (default: specs/<hostname>.toml)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reconcile",
        description="Keep a vLLM GPU machine in the state its TOML spec describes.",
        epilog=EXIT_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"reconcile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("plan", help="show the drift between the spec and the machine")
    _add_spec(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", metavar="FILE", help="also save the plan for `reconcile apply FILE`")
    p.add_argument("--quiet", action="store_true", help="one line when converged")
    _add_unattended(p)

    p = sub.add_parser("apply", help="converge the machine to the spec")
    _add_spec(p)
    p.add_argument("planfile", nargs="?", help="run exactly this saved plan (from plan --out)")
    p.add_argument("--lock-timeout", type=float, default=60.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="one line when nothing changed")
    p.add_argument(
        "--no-auto-rollback",
        action="store_true",
        help="keep a switch that fails readiness or the acceptance check (default: switch back)",
    )
    _add_unattended(p)

    p = sub.add_parser("status", help="conditions per resource, the server's health and GPU use")
    _add_spec(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("check", help="one chat completion (and reasoning / tool call) through the key")
    _add_spec(p)

    p = sub.add_parser("history", help="list generations and what changed in each")
    _add_spec(p)
    p = sub.add_parser("diff", help="packages, config.json keys, args and env that differ between two")
    _add_spec(p)
    p.add_argument("a", type=int)
    p.add_argument("b", type=int)
    p = sub.add_parser(
        "rollback",
        help="switch to generation N (default: the one below the current), offline, and hold it",
    )
    _add_spec(p)
    p.add_argument("generation", type=int, nargs="?")
    p.add_argument("--lock-timeout", type=float, default=60.0, metavar="SECONDS")
    p = sub.add_parser("gc", help="remove realizations no current, held or recent generation uses")
    _add_spec(p)
    p.add_argument("--keep", type=int, default=3, metavar="N", help="also keep the last N generations (3)")
    p.add_argument("--lock-timeout", type=float, default=60.0, metavar="SECONDS")

    sub.add_parser("schema", help="every spec key with its type, default and meaning")
    _add_unattended_commands(sub)
    return parser


def _add_unattended(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scheduled",
        action="store_true",
        help="run from the timer: honour `reconcile pause` (apply only plans while paused)",
    )
    p.add_argument(
        "--textfile",
        metavar="PATH",
        help="also write Prometheus metrics here (node_exporter's textfile collector, *.prom)",
    )


def _add_unattended_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("timer", help="run `reconcile apply --scheduled` from a systemd timer (or cron)")
    timer = p.add_subparsers(dest="timer_command", metavar="ACTION", required=True)
    for name, text in (
        ("install", "write (and enable) the service and timer"),
        ("cron", "print an /etc/cron.d file, for machines without systemd"),
    ):
        t = timer.add_parser(name, help=text)
        _add_spec(t)
        t.add_argument("--every", default="5m", help="5m, 15m, 1h, ... (default 5m)")
        t.add_argument(
            "--randomized-delay",
            metavar="DURATION",
            help="spread ticks over this (default: a fifth of --every)",
        )
        t.add_argument("--lock-timeout", type=float, default=300.0, metavar="SECONDS")
        t.add_argument("--textfile", metavar="PATH", help="metrics file for node_exporter, passed to apply")
        t.add_argument("--name", default="reconcile-apply", help="unit name (default reconcile-apply)")
        if name == "install":
            t.add_argument("--unit-dir", default="/etc/systemd/system", metavar="DIR")
    t = timer.add_parser("remove", help="disable the timer and delete both units")
    t.add_argument("--name", default="reconcile-apply")
    t.add_argument("--unit-dir", default="/etc/systemd/system", metavar="DIR")

    p = sub.add_parser("pause", help="hold off scheduled applies (they only plan) while a person works")
    _add_spec(p)
    p.add_argument("--reason", required=True, help="why: shown to the next person and in every report")
    p.add_argument("--for", dest="duration", metavar="DURATION", help="end by itself after this (e.g. 4h)")
    p = sub.add_parser("resume", help="end a pause or a rollback's hold: applies follow the spec again")
    _add_spec(p)

    p = sub.add_parser("init", help="probe this machine and write a starting spec")
    p.add_argument("--out", metavar="PATH", help="where (default specs/<hostname>.toml; - prints it)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--state-dir", default="/var/lib/reconcile", metavar="DIR")
    p.add_argument("--pid", type=int, help="take the running vLLM server from this process")
    p.add_argument(
        "--manage-server",
        action="store_true",
        help="write a found server as live [server] (the next apply restarts it under reconcile)",
    )

    p = sub.add_parser("lock", help="pin what floats (package ranges, the model's branch): specs/<name>.lock")
    _add_spec(p)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        from reconcile import commands

        handler = getattr(commands, "cmd_" + args.command)
        code: int = handler(args)
        return code
    except ReconcileError as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("reconcile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        import os
        import traceback

        if os.environ.get("RECONCILE_DEBUG"):
            traceback.print_exc()
        print(
            f"reconcile: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug; RECONCILE_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
