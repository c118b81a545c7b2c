"""Switching what serves, the one way: apply, `apply FILE`, `rollback`, an automatic rollback and the
apply after `resume` all run `switch`, which records the generation that then serves. One function per
phase, each under the apply lock: `prepare` (before the plan), the Changes (reconcile.apply.changes),
`judge` (readiness, then the acceptance check), `record` (the generation made current), `interrupted`
(what a Ctrl-C or SIGTERM left). `rollback` and the hold are in reconcile.apply.rollback.

Called by reconcile.apply.executor (apply, apply FILE, automatic rollback), reconcile.apply.rollback
and the history command (the generation serving).
"""

from __future__ import annotations

import contextlib

from reconcile.apply import bench_gate, generations, phases
from reconcile.apply.changes import ApplyReport, ChangeResult, ProgressFn, apply_spec
from reconcile.apply.realization import (
    generation_spec,
    profiles_moved,
    realized_state,
    restore_config,
    seal_realization,
)
from reconcile.errors import ReconcileError
from reconcile.plan.records import Action, Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


class SwitchInterrupted(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM during a switch; its text says what was left (the run's final line)."""


class Switch:
    """One switch: the user's spec (`original`: its secrets, its `[venv] path`), the spec applied
    (the user's, or generation `gen`'s), why, and what the phases found."""

    def __init__(
        self, original: LoadedSpec, applied: LoadedSpec, reason: str, gen: dict[str, Any] | None = None
    ) -> None:
        self.original, self.applied, self.reason, self.gen = original, applied, reason, gen
        self.state_dir = applied.spec.machine.state_dir
        self.before: int | None = None  # the generation serving when the switch began
        self.problem: str | None = None  # why the switch does not serve (None: it does, or nothing switched)
        self.left: str | None = None  # what an interrupted switch left, in words


# --- what serves now ---------------------------------------------------------------------------------


def running_server(spec: Spec) -> tuple[str | None, int | None]:
    """(the launch identity stamped into the deployment's live server, its pid); (None, None) when none
    runs or the spec has no server."""
    if spec.server is None:
        return None, None
    from reconcile.plan.prober import probe_some

    found = getattr(probe_some(spec, ("server",)).server, "server", None)
    return (found.identity, found.pid) if found is not None else (None, None)


def carries(state: dict[str, Any], identity: str | None) -> bool:
    """Whether a live server of launch identity `identity` is generation record `state`'s: its own
    server's, or behind [front] one of its colors' (a color runs under its own name and socket)."""
    launch = state.get("launch") or {}
    if identity is None:
        return False
    if "colors" in launch:  # fronted: only a color serves (its un-colored identity never runs)
        return identity in (launch.get("colors") or {}).values()
    return identity == launch.get("identity")


def serving(state_dir: str, identity: str | None) -> int | None:
    """The generation whose server (or, behind [front], one of whose colors) carries launch identity
    `identity` (the newest, should two share it)."""
    if identity is None:
        return None
    for g in reversed(generations.read_all(state_dir)):
        if carries(g, identity):
            return int(g["generation"])
    return None


def serving_generation(spec: Spec) -> int | None:
    """The generation serving: the one whose identity the live server carries; without a live server
    (or one that is no recorded generation), the current one of the index."""
    state_dir = spec.machine.state_dir
    return serving(state_dir, running_server(spec)[0]) or generations.current(state_dir)


# --- the phases, each under the apply lock -------------------------------------------------------------


def prepare(sw: Switch, report: ApplyReport) -> None:
    """Before the plan: note what serves now, put the target generation's config.json bytes back."""
    try:
        sw.before = serving_generation(sw.applied.spec)
    except (OSError, ReconcileError):  # the server could not be probed: the index's word
        sw.before = generations.current(sw.state_dir)
    if sw.gen is not None:
        restore_config(sw.applied, sw.gen)


def _server_result(report: ApplyReport) -> ChangeResult | None:
    """The result of the row whose action switches what serves (`Kind.serves`), if it ran."""
    from reconcile.resources import BY_NAME

    return next((r for r in report.results if BY_NAME[r.resource].serves), None)


def judge(sw: Switch, report: ApplyReport) -> bool:
    """Whether this apply switched the server; `sw.problem` says why the switch fails (None: it
    serves). A switch must get ready, then pass the acceptance check (`reconcile check`'s chat,
    reasoning and forced tool call as the spec enables them)."""
    server, spec = _server_result(report), sw.applied.spec
    if server is not None and server.result == Result.FAILED:
        sw.problem = f"the server did not become ready: {server.message}"
        return True
    if server is None or server.result != Result.CHANGED or spec.server is None or not spec.server.running:
        return False
    from probes.health import chat_check

    try:
        check = chat_check(spec)
    except Exception as exc:  # a check that cannot even ask has not passed
        sw.problem = f"acceptance check failed: {type(exc).__name__}: {exc}"
        return True
    if not check.ok:
        sw.problem = "acceptance check failed: " + "; ".join(
            f"{s.name}: {s.message}" for s in check.steps if not s.ok
        )
    return True


def record(sw: Switch, report: ApplyReport, *, judged: bool, always: bool) -> None:
    """Make the state now realized the current generation (a new one, or the one that has it) and
    set `report.generation` when that moved; its verdict when `judged`. Nothing switched (and not
    `always`, a rollback's): the generation serving is made current, nothing else. A record that
    cannot be written must not hide what the apply did: it becomes a note."""
    if report.refused is not None:
        return
    then = generations.current(sw.state_dir)
    try:
        # A switch back to realizations that are all there changes no file: the profile links say it.
        moved = profiles_moved(sw.original, sw.applied)
        if (
            not always
            and not report.changed
            and _server_result(report) is None
            and then is not None
            and not moved
        ):
            if sw.before is not None and sw.before != then:
                generations.set_current(sw.state_dir, sw.before)  # an apply killed before its record
            return
        number, new = generations.record(sw.state_dir, realized_state(sw.applied), reason=sw.reason)
        report.generation = number if new or number != then else None
        sw.problem = sw.problem or bench_gate.after_switch(
            sw.applied.spec, sw.state_dir, number, judged=judged, reason=sw.reason
        )
        if judged:
            why = sw.problem or "ready, acceptance check passed"
            generations.set_verdict(sw.state_dir, number, sw.problem is None, why)
        seal_realization(sw.original, sw.applied, report, sw.problem is None)
    except (OSError, ReconcileError) as exc:
        report.notes.append(f"could not record the generation: {exc}")
    if sw.problem is not None:
        report.results.append(
            ChangeResult("acceptance", Action.CHANGE, "the switch", Result.FAILED, sw.problem, 0.0)
        )


def interrupted(sw: Switch, report: ApplyReport) -> None:
    """A Ctrl-C or SIGTERM stopped the switch: the generation whose server runs now is made current,
    and `sw.left` (and `report.interrupted`) say what was left (a new server still starting is left
    running and recorded, unjudged: the next apply waits for it and judges it)."""
    report.interrupted = sw.left = _left(sw, report)


def _left(sw: Switch, report: ApplyReport) -> str:
    back = f"; `reconcile rollback {sw.before}` goes back" if sw.before is not None else ""
    try:
        identity, pid = running_server(sw.applied.spec)
        state = realized_state(sw.applied)
        if carries(state, identity):
            number, _ = generations.record(sw.state_dir, state, reason=f"{sw.reason} (interrupted)")
            report.generation = number
            if number == sw.before:
                return f"generation {number} still serves (pid {pid})"
            return (
                f"generation {number}'s server (pid {pid}) was left starting, recorded and not judged: "
                f"`reconcile apply` waits for it and judges it{back}"
            )
        number_or_none = serving(sw.state_dir, identity)
        if number_or_none is not None:
            generations.set_current(sw.state_dir, number_or_none)
            return f"generation {number_or_none} still serves (pid {pid})"
        if identity is None:
            return f"no server runs: `reconcile apply` starts it{back}"
        return f"a server runs (pid {pid}) that is no recorded generation{back}"
    except (OSError, ReconcileError) as exc:
        return f"what serves could not be recorded: {exc}"


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM (systemd stopping the timer's apply) stops a switch as Ctrl-C does, not silently."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def switch(
    sw: Switch,
    *,
    lock_timeout: float,
    progress: ProgressFn | None = None,
    always_record: bool = False,
    after: Callable[[Switch, ApplyReport], None] | None = None,
    **apply_options: Any,
) -> ApplyReport:
    """The one way what serves changes: lock, `prepare`, the Changes, `judge`, `record`, then `after`
    (the executor's automatic rollback decision), all under the lock. `always_record` (a rollback):
    record even when nothing had to change. `apply_options` go to apply_spec (expected, exact,
    scheduled, rollback_of)."""

    def done(report: ApplyReport) -> None:
        judged = judge(sw, report) if report.refused is None else False
        phases.lap("judge")
        record(sw, report, judged=judged, always=always_record)
        if after is not None:
            after(sw, report)
        phases.lap("record")

    with _terminable():
        try:
            return apply_spec(
                sw.applied,
                lock_timeout=lock_timeout,
                progress=progress,
                on_locked=lambda report: prepare(sw, report),
                on_done=done,
                on_interrupt=lambda report: interrupted(sw, report),
                **apply_options,
            )
        except SwitchInterrupted:
            raise
        except KeyboardInterrupt:
            if sw.left is not None:
                raise SwitchInterrupted(sw.left) from None
            raise


def switch_to(
    loaded: LoadedSpec,
    gen: dict[str, Any],
    lock_timeout: float,
    progress: ProgressFn | None,
    *,
    reason: str,
    at: tuple[LoadedSpec, list[str]] | None = None,
) -> ApplyReport:
    """Switch to generation `gen`: its spec at its realization (`at`: generation_spec's answer, when
    the caller made it already), its config.json bytes put back first, recorded current even when it
    already served (nothing to restart)."""
    applied, notes = at if at is not None else generation_spec(gen, loaded)
    report = switch(
        Switch(loaded, applied, reason, gen),
        lock_timeout=lock_timeout,
        progress=progress,
        always_record=True,
        rollback_of=int(gen["generation"]),
    )
    report.notes[:0] = notes
    return report
