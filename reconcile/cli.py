"""The `reconcile` command line. Parses arguments, calls the core, maps outcomes to exit codes.

argparse (stdlib) rather than click/typer, and only the invoked command's parser is built. Every
user-facing error, a usage error included, is one line, exit 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from reconcile import __version__
from reconcile.errors import ReconcileError
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    Builder = Callable[[argparse.ArgumentParser], None]

EXIT_DOC = """exit codes (Puppet's --detailed-exitcodes):
  0    plan: converged · apply: nothing to do (or paused, with --scheduled) · status: all ok
  1    an error before any change: usage, bad spec, preflight error, lock timeout, stale plan
       file, an apply or rollback not approved
  2    plan: changes pending · apply: changes made and converged · status: drift · lock: written
  4    apply: a change failed, the machine is not converged, or a switch failed readiness or the
       acceptance check (and was rolled back to the last good generation)
  130  interrupted (Ctrl-C, SIGINT): last-run.json and the textfile say "interrupted"

run `reconcile COMMAND --help` for a command's options and examples"""


class Option(Record):
    """A `--name` option as data: with a metavar it takes a value (`default` when absent; a float when
    `number`, as argparse's type=float), without one it is a flag (store_true, default False).
    argparse is given these."""

    flag: str
    metavar: str | None
    help: str | None
    number: bool = False
    default: object = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def add_to(self, p: argparse.ArgumentParser) -> None:
        if self.metavar is None:
            p.add_argument(self.flag, action="store_true", help=self.help)
        elif self.number:
            p.add_argument(self.flag, type=float, default=self.default, metavar=self.metavar, help=self.help)
        else:
            p.add_argument(self.flag, metavar=self.metavar, help=self.help, default=self.default)


SPEC = Option("--spec", "PATH", "spec file (default: specs/<hostname>.toml)")
DEPLOYMENT = Option(
    "--deployment", "NAME", "only this deployment of a spec with [deployments] (default: all of them)"
)
SCHEDULED = Option(
    "--scheduled",
    None,
    "run from the timer: honour `reconcile pause` (apply only plans while paused); never asks",
)
TEXTFILE = Option(
    "--textfile", "PATH", "also write Prometheus metrics here (node_exporter's textfile collector, *.prom)"
)
PLAN_OPTIONS = (
    SPEC,
    DEPLOYMENT,
    Option("--json", None, "print the plan as JSON (format reconcile-plan/2)"),
    Option("--out", "FILE", "also save the plan for `reconcile apply FILE`"),
    Option("--quiet", None, "one line when converged"),
    SCHEDULED,
    TEXTFILE,
)
AUTO_APPROVE = Option(
    "--auto-approve",
    None,
    "do not show the plan and ask for `yes` first (asked only when stdin is a terminal)",
)
LOCK_TIMEOUT = Option("--lock-timeout", "SECONDS", None, number=True, default=60.0)
APPLY_OPTIONS = (
    SPEC,  # then the planfile positional (_apply)
    Option(
        "--no-auto-rollback",
        None,
        "keep a switch that fails readiness or the acceptance check (default: switch back)",
    ),
    AUTO_APPROVE,
    LOCK_TIMEOUT,
    Option("--json", None, "print the result as JSON (format reconcile-apply/1)"),
    Option("--quiet", None, "no progress; one line when nothing changed"),
    Option(
        "--reset-crash-loop",
        None,
        "forget the server's failed starts first (the crash-loop guard's hold ends)",
    ),
    SCHEDULED,
    TEXTFILE,
)


def _spec(p: argparse.ArgumentParser) -> None:
    SPEC.add_to(p)


def _unattended(p: argparse.ArgumentParser) -> None:
    SCHEDULED.add_to(p)
    TEXTFILE.add_to(p)


def _approve(p: argparse.ArgumentParser) -> None:
    AUTO_APPROVE.add_to(p)
    LOCK_TIMEOUT.add_to(p)


def _plan(p: argparse.ArgumentParser) -> None:
    for option in PLAN_OPTIONS:
        option.add_to(p)


def _apply(p: argparse.ArgumentParser) -> None:
    SPEC.add_to(p)
    DEPLOYMENT.add_to(p)
    p.add_argument("planfile", nargs="?", help="run exactly this saved plan (from plan --out)")
    for option in APPLY_OPTIONS[1:]:
        option.add_to(p)


def _one(p: argparse.ArgumentParser) -> None:
    _spec(p)
    DEPLOYMENT.add_to(p)


def _status(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument("--json", action="store_true", help="print the status as JSON (format reconcile-status/1)")


def _diff(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument("a", type=int, metavar="N", help="the older generation's number (see `reconcile history`)")
    p.add_argument("b", type=int, metavar="M", help="the newer generation's number")


def _rollback(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument(
        "generation", type=int, nargs="?", metavar="N", help="generation (default: the one before)"
    )
    _approve(p)


def _schema(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="the spec's JSON Schema (for Taplo / VS Code's Even Better TOML), instead of the key list",
    )


def _gc(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument("--keep", type=int, default=3, metavar="N", help="also keep the last N generations (3)")
    p.add_argument("--lock-timeout", type=float, default=60.0, metavar="SECONDS")


def _validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", nargs="?", default="specs", help="the directory of specs (default: specs)")
    p.add_argument("--strict", action="store_true", help="a warning fails the check too")


def _timer(p: argparse.ArgumentParser) -> None:
    timer = p.add_subparsers(dest="timer_command", metavar="ACTION", required=True)
    for name, text in (
        ("install", "write (and enable) the service and timer"),
        ("cron", "print an /etc/cron.d file, for machines without systemd"),
    ):
        t = timer.add_parser(name, help=text, description=text)
        _spec(t)
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


def _pause(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument("--reason", required=True, help="why: shown to the next person and in every report")
    p.add_argument("--for", dest="duration", metavar="DURATION", help="end by itself after this (e.g. 4h)")


def _init(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="PATH", help="where (default specs/<hostname>.toml; - prints it)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--state-dir", default="/var/lib/reconcile", metavar="DIR")
    p.add_argument("--pid", type=int, help="take the running vLLM server from this process")
    p.add_argument(
        "--manage-server",
        action="store_true",
        help="write a found server as live [server] (the next apply restarts it under reconcile)",
    )


def _bench(p: argparse.ArgumentParser) -> None:
    _one(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON (format reconcile-bench/1)")
    p.add_argument(
        "--compare",
        nargs=2,
        type=int,
        metavar=("N", "M"),
        help="set generations N and M's figures side by side",
    )
    LOCK_TIMEOUT.add_to(p)


# name: (one-line help, its arguments, examples shown by `reconcile NAME --help`)
COMMANDS: dict[str, tuple[str, Builder, str]] = {
    "plan": (
        "show the drift between the spec and the machine",
        _plan,
        "reconcile plan --spec specs/gpu-box.toml\n"
        "reconcile plan --json | jq '.resources[] | select(.status != \"ok\")'\n"
        "reconcile plan --out plan.json && reconcile apply plan.json",
    ),
    "apply": (
        "converge the machine to the spec (asks first on a terminal)",
        _apply,
        "reconcile apply --spec specs/gpu-box.toml       # shows the plan, asks for yes\n"
        "reconcile apply --auto-approve                  # no question\n"
        "reconcile apply --json --auto-approve           # for Ansible and scripts\n"
        "reconcile apply plan.json                       # exactly a saved plan",
    ),
    "status": (
        "conditions per resource, pause, the server's health, load and GPU use; writes nothing",
        _status,
        "reconcile status\nreconcile status --json | jq .server.metrics",
    ),
    "check": (
        "one chat completion (and reasoning / tool call) through the key",
        _one,
        "reconcile check --spec specs/gpu-box.toml",
    ),
    "history": (
        "list generations (a spec with [deployments]: the machine's, and which deployment changed)",
        _one,
        "reconcile history\nreconcile history --deployment chat   # one deployment's own",
    ),
    "diff": (
        "compare generation N with generation M: the spec text and the resolved versions",
        _diff,
        "reconcile diff 3 4        # what changed between the third and fourth apply",
    ),
    "rollback": (
        "switch to generation N's realization (default: the one below the current), offline, restart "
        "once and hold it until the spec changes or `reconcile resume` (asks first on a terminal)",
        _rollback,
        "reconcile rollback        # back to the generation below the current one\n"
        "reconcile rollback 3 --auto-approve\n"
        "reconcile rollback 2 --deployment chat   # one deployment; without: the machine's generation",
    ),
    "gc": (
        "remove venv realizations no current, held or recent generation (or running process) uses",
        _gc,
        "reconcile gc              # keeps the current, a held and the last 3 generations\n"
        "reconcile gc --keep 10",
    ),
    "schema": (
        "every spec key with its type, default and meaning (--json: the JSON Schema)",
        _schema,
        "reconcile schema\nreconcile schema --json > reconcile.schema.json   # for Taplo / VS Code",
    ),
    "validate": (
        "the fleet repository's CI check: load every spec of a directory, preflight it offline",
        _validate,
        "reconcile validate specs/            # one line per problem; exit 1 on an error\n"
        "reconcile validate --strict specs/   # a warning fails too",
    ),
    "timer": (
        "run `reconcile apply --scheduled` from a systemd timer (or cron)",
        _timer,
        "reconcile timer install --every 5m --textfile /var/lib/node_exporter/reconcile.prom\n"
        "reconcile timer cron --every 15m > /etc/cron.d/reconcile\nreconcile timer remove",
    ),
    "pause": (
        "hold off scheduled applies (they only plan) while a person works",
        _pause,
        'reconcile pause --reason "debugging the KV cache" --for 4h',
    ),
    "resume": (
        "end a pause or a rollback's hold: scheduled applies follow the spec again",
        _one,
        "reconcile resume",
    ),
    "init": (
        "probe this machine and write a starting spec",
        _init,
        "reconcile init                 # specs/<hostname>.toml\nreconcile init --out - | less",
    ),
    "lock": (
        "pin what floats (package ranges, the model's branch): specs/<name>.lock",
        _spec,
        "reconcile lock && git add specs/*.lock",
    ),
    "bench": (
        "the reference benchmark table against the running server (`vllm bench serve`), kept per generation",
        _bench,
        "reconcile bench --spec specs/gpu-box.toml\nreconcile bench --json | jq .headline\n"
        "reconcile bench --compare 3 4   # two generations' figures side by side",
    ),
}


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv (the first word), if it is one: only its parser is built."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, only that subcommand gets its arguments (the others are listed)."""
    from reconcile.argparsing import Formatter as _Formatter
    from reconcile.argparsing import Parser as _Parser

    parser = _Parser(
        prog="reconcile",
        description="Keep a vLLM GPU machine in the state its TOML spec describes.",
        epilog=EXIT_DOC,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"reconcile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, build, examples) in COMMANDS.items():
        if command is not None and name != command:
            continue
        p = sub.add_parser(
            name,
            help=text,
            description=text,
            epilog="examples:\n" + "\n".join(f"  {line}" for line in examples.splitlines()),
            formatter_class=_Formatter,
        )
        if name == command:
            build(p)
    return parser


def parse(words: Sequence[str]) -> argparse.Namespace | int:
    """The arguments, or the exit code when there is nothing to run (help, version, a usage error)."""
    parser = build_parser(_command_of(words))
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # --help and --version exit 0; usage errors exit 1 (see argparsing.Parser)
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Everything printed goes through SafeStream (reconcile/safety/display.py): a control character
    in a string from outside (a server's answer, a log line, a process title) is shown escaped,
    never acted on by the terminal, wherever in the code it is printed."""
    from reconcile.safety.display import SafeStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        return _main(argv)
    finally:
        for wrapper in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                wrapper.flush()
        sys.stdout, sys.stderr = out, err


def _trusted_search_path() -> None:
    """Every program reconcile runs by name is looked up on a PATH only root or we can change
    (reconcile.safety.filesafety.search_path), and no program it runs takes its config or cache from
    a directory another user can change (HOME, XDG_*, uv's and pip's: filesafety.trusted_environment,
    as `sudo -E` hands them over); what is left out is said once on stderr."""
    from reconcile.host import check_programs
    from reconcile.safety.filesafety import env_dir_problem, resolve_exec, search_path, trusted_environment

    changes, notes = trusted_environment(os.environ)
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for why in notes:
        print(f"reconcile: environment {why}", file=sys.stderr)
    # The interpreter read PYTHONPYCACHEPREFIX at start (sys.pycache_prefix), and every later import
    # looks there for its compiled form, taking any file whose header matches the source, whoever wrote
    # it: leaving the variable out of the environment changes nothing for this process. What was
    # imported before this line is out of reach (docs/security.md, ninth round: run sudo without -E).
    if sys.pycache_prefix is not None and (loose := env_dir_problem(sys.pycache_prefix)) is not None:
        sys.pycache_prefix = None
        if "PYTHONPYCACHEPREFIX" not in changes:  # -X pycache_prefix=: not said above
            print(f"reconcile: pycache prefix left out: {loose}", file=sys.stderr)

    check_programs(resolve_exec)  # and each program found there: the exec role, file and interpreter
    kept, dropped = search_path(os.environ.get("PATH", os.defpath))
    if dropped:
        os.environ["PATH"] = kept
        for why in dropped:
            print(f"reconcile: PATH entry left out: {why}", file=sys.stderr)


def _main(argv: Sequence[str] | None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    if isinstance(args, int):
        return args
    try:
        from reconcile.commands import handler
        from reconcile.safety.filesafety import STATE_UMASK

        # What apply makes without an explicit mode is private (state, reports, secrets); the trees
        # it builds for others to read (venv, model dir) set their own umask (filesafety.TREE_UMASK).
        os.umask(STATE_UMASK)
        _trusted_search_path()

        return handler(args.command)(args)
    except ReconcileError as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # a switch says what it left (reconcile.apply.switching)
        left = str(exc) if str(exc) not in ("", "SIGTERM") else ""
        print(f"\nreconcile: interrupted{': ' + left if left else ''} (exit 130)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        import traceback

        if os.environ.get("RECONCILE_DEBUG"):
            traceback.print_exc()
        print(
            f"reconcile: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug; RECONCILE_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        _state_notes()


def _state_notes() -> None:
    """The state files moved aside that the command's own output did not show (each said once)."""
    statefiles = sys.modules.get("reconcile.safety.statefiles")  # not loaded: none was read
    if statefiles is not None:
        for line in statefiles.take_notes():
            print(f"reconcile: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
