"""What the commands share: loading the spec (its lock's pins, its realization), the held generation,
the run report, the apply report on stdout and the terminal's approval. Called by reconcile.commands.*.
"""

from __future__ import annotations

import contextlib
import sys
import time
from types import SimpleNamespace

from reconcile.errors import ReconcileError
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    Args = argparse.Namespace | SimpleNamespace  # argparse's, or one made here (the report's spec)


def load_spec(args: Args) -> LoadedSpec:
    from reconcile.spec.cache import load
    from reconcile.spec.loaded import find_spec
    from reconcile.spec.pins import apply_lock_pins

    # The lock's pins (specs/<name>.lock) are the desired state wherever the spec is read; with
    # [venv] store, the venv is its realization's content-addressed path.
    loaded = apply_lock_pins(load(find_spec(getattr(args, "spec", None))))
    if getattr(loaded.spec.venv, "store", None) is False:  # `store = false`: nothing realized
        return loaded
    from reconcile.apply.store import realize

    return realize(loaded)


def with_hold(loaded: LoadedSpec) -> tuple[LoadedSpec, list[str]]:
    """The spec a scheduled apply would apply now (a held generation's), and the hold's note."""
    from reconcile.apply.generations import read_hold

    if read_hold(loaded.spec.machine.state_dir) is None:  # one small read when nothing is held
        return loaded, []
    from reconcile.apply.rollback import held_spec

    held, notes, _ = held_spec(loaded, scheduled=True)
    return held, notes


def state_notes() -> list[str]:
    """The state files moved aside so far (reconcile.safety.statefiles), for the plan or the report."""
    from reconcile.safety.statefiles import take_notes

    return take_notes()


def print_report(report: Any, *, as_json: bool, quiet: bool) -> None:
    """The apply report on stdout; in colour on a terminal (NO_COLOR and TERM=dumb respected)."""
    import io

    from reconcile.apply.changes import render_report
    from reconcile.plan.render import paint_report, use_colour

    if as_json or not use_colour(sys.stdout):
        render_report(report, sys.stdout, as_json=as_json, quiet=quiet)
        return
    text = io.StringIO()
    render_report(report, text, as_json=False, quiet=quiet)
    sys.stdout.write(paint_report(text.getvalue()))


def ask_approval(
    args: Args, loaded: LoadedSpec, title: str, moves: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """On a terminal (and without --auto-approve): the plan shown and a `yes`, or NotApproved."""
    from reconcile.apply.approval import approve, wants_question

    return approve(loaded, title=title, moves=moves) if wants_question(args) else None


def record_failure(
    args: Args, command: str, started: float, loaded: LoadedSpec | None, exc: ReconcileError
) -> None:
    with contextlib.suppress(ReconcileError, OSError):
        record_run(args, command, started, 1, loaded, error=str(exc))


def record_run(
    args: Args,
    command: str,
    started: float,
    exit_code: int,
    loaded: LoadedSpec | None,
    **facts: Any,
) -> None:
    """last-run.json under the spec's state_dir (every apply; a plan when --scheduled or --textfile)
    and the Prometheus textfile when --textfile is given."""
    from reconcile.unattended.report import RunFacts, report_run

    path = loaded.path if loaded is not None else (getattr(args, "spec", None) or "")
    server = loaded is not None and loaded.spec.server is not None
    run = RunFacts(
        command,
        bool(getattr(args, "scheduled", False)),
        started,
        time.time(),
        exit_code,
        path,
        loaded=loaded,
        server_wanted=server,
        **facts,
    )
    try:
        report_run(run, getattr(args, "textfile", None))
    except OSError as exc:  # the run's own outcome stands; a stale report is what monitoring alerts on
        print(f"reconcile: warning: could not write the run report: {exc}", file=sys.stderr)


def spec_state_dir(args: Args, *, one: bool = False) -> str:
    """The spec's state_dir, without the lock: a damaged lock must not keep a person from pausing. With
    [deployments]: the named deployment's (`one`: a deployment must be named), else the machine's."""
    from reconcile.spec.cache import load
    from reconcile.spec.loader import find_spec

    loaded = load(find_spec(args.spec))
    if not getattr(loaded.spec, "deployments", None) and getattr(args, "deployment", None) is None:
        return loaded.spec.machine.state_dir
    from reconcile.spec.deployments import chosen

    name = getattr(args, "deployment", None)
    if name is None and not one:  # pause, resume: the machine's (every deployment's) scheduled applies
        return loaded.spec.machine.state_dir
    every = chosen(loaded, name)
    if len(every) > 1:
        names = ", ".join(d.name for d in every)
        raise ReconcileError(
            f"{loaded.path} has several deployments ({names}): name one with --deployment NAME"
        )
    return every[0].loaded.spec.machine.state_dir
