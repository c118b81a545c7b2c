"""`history`, `diff N M` and `rollback N` of a spec with [deployments] without --deployment: the machine's
generations (reconcile.apply.machine_generations). A machine rollback is each deployment's own rollback
(reconcile.apply.rollback) where its generation differs, under the machine's apply lock; the others are
held where they are, untouched. Called by reconcile.commands.generations and .deployments.
"""

from __future__ import annotations

import contextlib
import sys
import time

from reconcile.apply import generations, machine_generations
from reconcile.errors import ReconcileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any, TextIO

    from reconcile.apply.changes import ApplyReport
    from reconcile.commands.common import Args
    from reconcile.spec.deployments import Deployment
    from reconcile.spec.loaded import LoadedSpec


def _names(loaded: LoadedSpec) -> list[str]:
    from reconcile.spec.deployments import deployments

    return [d.name for d in deployments(loaded)]


def record_machine(loaded: LoadedSpec, reason: str, notes: list[str]) -> None:
    """The machine's generation as the deployments now are (under its apply lock); a record that
    cannot be written becomes a note, never hides what the command did."""
    from reconcile.spec.deployments import is_multi

    if not is_multi(loaded):
        return
    try:
        machine_generations.sync(loaded.spec.machine.state_dir, _names(loaded), reason=reason)
    except (OSError, ReconcileError) as exc:
        notes.append(f"could not record the machine's generation: {exc}")


@contextlib.contextmanager
def machine_switch(loaded: LoadedSpec, reason: str, lock_timeout: float, notes: list[str]) -> Iterator[None]:
    """The machine's apply lock around a command that switches deployments, and its generation recorded
    at the end (an interrupted one included: what it left is what the machine is)."""
    from reconcile.apply.lock import apply_lock

    with apply_lock(loaded.spec.machine.state_dir, timeout=lock_timeout):
        try:
            yield
        finally:
            record_machine(loaded, reason, notes)


def _serving(d: Deployment) -> int | None:
    from reconcile.apply.switching import serving_generation

    try:
        return serving_generation(d.loaded.spec)
    except (OSError, ReconcileError):  # the server could not be probed: the index's word
        return generations.current(d.loaded.spec.machine.state_dir)


def _numbers(deps: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(deps.items())) or "no deployment"


def _what_changed(loaded: LoadedSpec, name: str, a: int | None, b: int | None) -> list[str]:
    """One deployment's move between two of its generations, with what differs (as `diff` says it)."""
    from reconcile.apply.history import differences
    from reconcile.spec.deployments import state_dir_of

    if a is None or b is None:
        return [f"{name}: {'added' if a is None else 'removed'}" + (f" (generation {b})" if b else "")]
    state_dir = state_dir_of(loaded.spec.machine.state_dir, name)
    try:
        lines = differences(state_dir, generations.read(state_dir, a), generations.read(state_dir, b))
    except ReconcileError as exc:
        lines = [str(exc)]
    return [f"{name}: generation {a} -> {b}", *(f"  {line}" for line in lines)]


def render_machine_history(loaded: LoadedSpec, stream: TextIO) -> int:
    """Every machine generation, oldest first: each deployment's generation in it and what changed; `*`
    on the one whose numbers are what serves now."""
    from reconcile.spec.deployments import deployments

    machine_dir = loaded.spec.machine.state_dir
    found = machine_generations.scan(machine_dir)
    every = deployments(loaded)
    if not found:
        stream.write(
            f"no machine generations under {machine_generations.profile_dir(machine_dir)} (nothing applied "
            "yet); `--deployment NAME` shows one deployment's\n"
        )
        return 0
    serving = {d.name: n for d in every if (n := _serving(d)) is not None}
    match = [n for n, g in found if not isinstance(g, str) and g["deployments"] == serving]
    star = match[-1] if match else None
    previous: Mapping[str, int] | None = None
    for n, g in found:
        if isinstance(g, str):
            stream.write(f" {n:>3}  skipped: {g}\n")
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(g["created"])))
        mark = "*" if n == star else " "
        stream.write(f"{mark}{n:>3}  {when}  {_numbers(g['deployments']):<28}  {g['reason']}\n")
        if previous is None:
            lines = ["first machine generation"]
        else:
            lines = []
            for name in g["changed"]:
                lines += _what_changed(loaded, name, previous.get(name), g["deployments"].get(name))
        for line in lines[:8]:
            stream.write(f"        {line}\n")
        if len(lines) > 8:
            stream.write(f"        … and {len(lines) - 8} more (reconcile diff {n - 1} {n})\n")
        previous = g["deployments"]
    if star is None:
        stream.write(
            f"\nnow serving: {_numbers(serving)}: no machine generation records it yet (the next "
            "`reconcile apply` does)\n"
        )
    holds = [(d.name, generations.read_hold(d.loaded.spec.machine.state_dir)) for d in every]
    for name, hold in holds:
        if hold is not None:
            stream.write(f"\n[{name}] {hold.describe()} (`reconcile resume` ends it)\n")
    return 0


def render_machine_diff(loaded: LoadedSpec, a: int, b: int, stream: TextIO) -> int:
    """Which deployments differ between machine generations `a` and `b`, and how."""
    machine_dir = loaded.spec.machine.state_dir
    ga, gb = machine_generations.read(machine_dir, a), machine_generations.read(machine_dir, b)
    da, db = ga["deployments"], gb["deployments"]
    stream.write(f"machine generation {a} -> {b}\n")
    for name in sorted(set(da) | set(db)):
        if da.get(name) == db.get(name):
            stream.write(f"  {name}: unchanged (generation {da[name]})\n")
            continue
        for line in _what_changed(loaded, name, da.get(name), db.get(name)):
            stream.write(f"  {line}\n")
    return 0


def _target(machine_dir: str, wanted: int | None) -> int:
    if wanted is not None:
        return wanted
    now, have = machine_generations.current(machine_dir), machine_generations.numbers(machine_dir)
    below = [n for n in have if now is not None and n < now]
    if not below:
        raise ReconcileError(
            f"{machine_generations.profile_dir(machine_dir)}: no machine generation before {now or 'none'} "
            f"to roll back to (have {', '.join(map(str, have)) or 'none'})"
        )
    return below[-1]


def _split(
    every: list[Deployment], wants: Mapping[str, int], target: int, notes: list[str]
) -> tuple[list[tuple[Deployment, int]], list[tuple[Deployment, int]]]:
    """(the deployments whose serving generation differs from machine generation `target`'s, the
    others), each with its number there; one not in it is noted and left as it is."""
    moves, stays = [], []
    for d in every:
        want = wants.get(d.name)
        if want is None:
            notes.append(f"{d.name}: not in machine generation {target}: left as it is")
        elif _serving(d) == want:
            stays.append((d, want))
        else:
            moves.append((d, want))
    return moves, stays


def machine_rollback(
    args: Args, loaded: LoadedSpec, progress: Any
) -> tuple[int, list[tuple[str, ApplyReport]]]:
    """`reconcile rollback [N]` of the machine: every deployment whose generation serving differs from
    machine generation N's is rolled back to it (its own rollback: one restart, held); the others are
    held at theirs, untouched. Then machine generation N is current again."""
    from reconcile.apply.approval import wants_question
    from reconcile.apply.realization import generation_spec, who
    from reconcile.apply.rollback import profile_moves, rollback
    from reconcile.commands.common import ask_approval
    from reconcile.commands.deployments import views

    machine_dir = loaded.spec.machine.state_dir
    target = _target(machine_dir, args.generation)
    wants = machine_generations.read(machine_dir, target)["deployments"]
    every = views(loaded)
    gone = sorted(set(wants) - {d.name for d in every})
    notes = [f"{name}: in machine generation {target} but not in the spec: left out" for name in gone]
    out: list[tuple[str, ApplyReport]] = []
    first = _split(every, wants, target, [])[0]
    for d, want in first:  # every question first, before the lock (a person may take a while)
        state_dir = d.loaded.spec.machine.state_dir
        gen = generations.read(state_dir, want)
        ask_approval(args, generation_spec(gen, d.loaded)[0], "rollback", profile_moves(d.loaded, gen))
    asked = {d.name for d, _ in first} if wants_question(args) else None
    with machine_switch(loaded, f"rollback to machine generation {target}", args.lock_timeout, notes):
        moves, stays = _split(every, wants, target, notes)  # again, under the lock
        if asked is not None and not {d.name for d, _ in moves} <= asked:
            raise ReconcileError(
                "what serves changed while you were asked (another apply ran): nothing was switched; "
                "run the rollback again"
            )
        for d, want in moves:
            progress(f"deployment {d.name}: rollback to its generation {want}")
            out.append(
                (d.name, rollback(d.loaded, want, lock_timeout=args.lock_timeout, progress=progress)[1])
            )
        for d, want in stays:  # held where it is: a later apply keeps it, as it keeps the others
            generations.write_hold(
                d.loaded.spec.machine.state_dir,
                generations.Hold(
                    want,
                    "rollback",
                    time.time(),
                    who(),
                    d.loaded.sha256,
                    f"reconcile rollback {target} (machine)",
                ),
            )
            notes.append(f"{d.name}: generation {want} already serves: untouched, held")
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    return target, out
