"""`reconcile apply`: where an apply starts. The spec, or the generation held, is applied
(reconcile.apply.changes: lock, each Change between two re-probes, the final plan); a switch is judged
and recorded as a generation, and after a switch that does not serve, apply goes back to the last good
generation (exit 4, the reason in the report). Called by the apply command.
"""

from __future__ import annotations

import time

from reconcile.apply import generations
from reconcile.apply.changes import ApplyReport, ProgressFn, apply_spec
from reconcile.apply.realization import restore_config, who
from reconcile.apply.switching import finish, held_spec, switch_to

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec


def apply(
    loaded: LoadedSpec,
    *,
    lock_timeout: float,
    scheduled: bool = False,
    auto_rollback: bool = True,
    progress: ProgressFn | None = None,
    expected: dict[str, Any] | None = None,
) -> ApplyReport:
    """`reconcile apply`: the held generation or the spec, then, after a switch that does not serve,
    back to the last good generation (exit 4, the reason in the report)."""
    state_dir = loaded.spec.machine.state_dir
    effective, notes, hold = held_spec(loaded, scheduled=scheduled)
    spec_server = effective.spec.server
    enabled = auto_rollback and getattr(spec_server, "auto_rollback", True)
    before = generations.current(state_dir)
    outcome: dict[str, Any] = {}

    def restore(report: ApplyReport) -> None:
        if hold is not None:
            restore_config(effective, generations.read(state_dir, hold.generation))

    def done(report: ApplyReport) -> None:
        outcome["problem"] = problem = finish(loaded, effective, report, reason="apply")
        if problem is None:
            if (
                hold is None
                and (old := generations.read_hold(state_dir)) is not None
                and old.kind == "failed"
            ):
                generations.release_hold(state_dir)  # the retried spec serves now
            return
        target = generations.last_good(
            state_dir, other_than=report.generation or generations.current(state_dir)
        )
        if (
            enabled
            and hold is None
            and target is not None
            and target["generation"] != generations.current(state_dir)
        ):
            generations.write_hold(
                state_dir,
                generations.Hold(target["generation"], "failed", time.time(), who(), loaded.sha256, problem),
            )
            outcome["target"] = target
        elif before is not None and not enabled:
            report.notes.append("automatic rollback is off: the failed generation stays")

    report = apply_spec(
        effective,
        lock_timeout=lock_timeout,
        scheduled=scheduled,
        # What a person approved at the terminal (the spec's plan; not a held generation's).
        expected=expected if effective is loaded else None,
        exact=False,
        progress=progress,
        on_locked=restore,
        on_done=done,
    )
    report.notes[:0] = notes
    target = outcome.get("target")
    if target is not None:
        back = switch_to(
            loaded, target, lock_timeout, progress, reason=f"automatic rollback: {outcome['problem']}"
        )
        report.notes.append(
            f"automatic rollback to generation {target['generation']}: {outcome['problem']}; "
            + ("it serves again" if back.exit_code in (0, 2) else "it did NOT come back: see below")
        )
        report.results += [r._replace(resource=f"rollback:{r.resource}") for r in back.results]
        report.notes += back.notes
    return report
