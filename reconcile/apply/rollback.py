"""`reconcile rollback [N]` and the hold: a rollback switches (reconcile.apply.switching) to generation N
and holds it; while a hold stands, applies work on the held generation's spec.

Called by reconcile.apply.executor (the spec an apply works on) and the commands (rollback; plan, status
and check for the hold).
"""

from __future__ import annotations

import os
import time

from reconcile.apply import generations
from reconcile.apply.realization import generation_spec, who
from reconcile.apply.switching import SwitchInterrupted, serving_generation, switch_to
from reconcile.errors import ReconcileError
from reconcile.safety.display import shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from reconcile.apply.changes import ApplyReport, ProgressFn
    from reconcile.spec.loaded import LoadedSpec


def held_spec(
    loaded: LoadedSpec, *, scheduled: bool
) -> tuple[LoadedSpec, list[str], generations.Hold | None]:
    """The spec an apply works on: the user's, or the held generation's while the hold stands.
    Releases a hold whose spec content changed since it was made. Returns (spec, notes, hold)."""
    state_dir = loaded.spec.machine.state_dir
    hold = generations.read_hold(state_dir)
    if hold is None:
        return loaded, [], None
    if hold.from_spec != loaded.sha256:
        generations.release_hold(state_dir)
        return loaded, [f"the spec changed since it was {hold.describe()}: hold released"], None
    if hold.kind == "failed" and not scheduled:
        return loaded, [f"{hold.describe()}; this apply retries the spec that failed"], None
    try:
        held, notes = generation_spec(generations.read(state_dir, hold.generation), loaded)
    except ReconcileError as exc:
        raise ReconcileError(f"{hold.describe()}; but {exc} (`reconcile resume` ends the hold)") from None
    how = (
        "`reconcile resume` ends it"
        if hold.kind == "rollback"
        else "scheduled applies keep it until the spec changes; `reconcile apply` retries the spec"
    )
    return held, [f"{hold.describe()} ({how})", *notes], hold


def rollback(
    loaded: LoadedSpec,
    target: int | None,
    *,
    lock_timeout: float,
    progress: ProgressFn | None = None,
    approve: Callable[[LoadedSpec, tuple[str, ...]], object] | None = None,
) -> tuple[int, ApplyReport]:
    """`reconcile rollback [N]`: switch to generation N's realization (default: the one numbered below
    the one serving), restart once (not at all when N already serves: it is marked current), and hold
    it until the spec changes or `reconcile resume`. `approve` (a terminal's question) sees generation
    N's spec and the profile links it moves first, and raises to change nothing."""
    state_dir = loaded.spec.machine.state_dir
    have = [g["generation"] for g in generations.read_all(state_dir)]
    if target is None:
        now = serving_generation(loaded.spec)
        below = [n for n in have if now is not None and n < now]
        if not below:
            raise ReconcileError(
                f"{generations.profile_dir(state_dir)}: no generation before {now or 'none'} to roll back to "
                f"(have {', '.join(map(str, have)) or 'none'})"
            )
        target = below[-1]
    gen = generations.read(state_dir, target)
    at = generation_spec(gen, loaded)  # once: the question shows it, the switch applies it
    if approve is not None:
        approve(at[0], profile_moves(loaded, gen))
    venv = (gen.get("venv") or {}).get("path")
    rebuilt = bool(venv) and not os.path.isdir(str(venv))
    previous = generations.read_hold(state_dir)
    # Held before the lock is taken: a timer apply that gets it first already keeps generation N.
    generations.write_hold(
        state_dir,
        generations.Hold(
            target, "rollback", time.time(), who(), loaded.sha256, f"reconcile rollback {target}"
        ),
    )
    try:
        report = switch_to(loaded, gen, lock_timeout, progress, reason=f"rollback to {target}", at=at)
    except BaseException as exc:
        if isinstance(exc, SwitchInterrupted) and generations.current(state_dir) == target:
            raise  # interrupted once generation N's server was started: it stays held
        if previous is None:  # nothing switched: the hold as it was
            generations.release_hold(state_dir)
        else:
            generations.write_hold(state_dir, previous)
        raise
    if rebuilt:
        report.notes.append(f"{venv} had been removed (gc): it was built again")
    return target, report


def profile_moves(loaded: LoadedSpec, gen: dict[str, Any]) -> tuple[str, ...]:
    """The profile links (the spec's `[venv] path` and `[model] dir`) that now point elsewhere than
    generation `gen`'s realizations: what a rollback moves that no plan row shows."""
    moves = []
    for label, section, key in (("[venv] path", "venv", "path"), ("[model] dir", "model", "dir")):
        link = (loaded.resolved.get(section) or {}).get(key)
        target = (gen.get(section) or {}).get(key)
        if not isinstance(link, str) or not isinstance(target, str) or link == target:
            continue
        try:
            now = os.readlink(link)
        except OSError:  # absent, or not a link (a real dir used in place): the switch makes it
            now = "(not a link)" if os.path.lexists(link) else "(absent)"
        if now != target:
            moves.append(f"{label} {shown(link)}: {shown(now)} -> {shown(target)}")
    return tuple(moves)
