"""`reconcile gc [--keep N]`: remove the realizations no current, held or recent generation uses.

Called by the CLI, under the apply lock. Never removes what a live process of reconcile's own runs
from (its cgroups, its recorded launches: never a stranger's command line), nor anything
under the store that is not a `<hash>-venv` or `<hash>-model` realization, or, under `<store>/hub`,
a model snapshot no kept realization holds and the blobs only it held (huggingface_hub decides which).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field

from reconcile.apply import generations
from reconcile.apply.model_store import HUB, collect_snapshots, referenced_snapshots
from reconcile.apply.store import disk_usage, in_use_by_processes, realizations, remove


@dataclass
class Collected:
    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # path -> why
    freed: int = 0  # bytes


def collect(
    state_dir: str,
    store: str,
    *,
    keep: int,
    extra_keep: tuple[str, ...] = (),
    others: tuple[tuple[str, str], ...] = (),
    running: Collection[int] = (),
) -> Collected:
    """`others`: (name, state dir) of the spec's other deployments, which share the store: what their
    generations keep is kept too (a gc of one deployment never removes another's realization).
    `running`: reconcile's own processes (membership.reconcile_processes); what they run from is kept."""
    why: dict[str, str] = {p: "the spec's realization" for p in extra_keep}
    for name, other in others:
        for p, w in _kept_by(other, keep).items():
            why.setdefault(p, f"deployment {name}'s {w}")
    why.update(_kept_by(state_dir, keep))
    found = realizations(store)
    for p in in_use_by_processes(found, running):
        why[p] = "a running process uses it"
    out = Collected(kept={p: w for p, w in why.items() if p in found})
    doomed = [p for p in found if p not in why]
    hub = os.path.join(store, HUB)
    before = disk_usage([*found, hub] if os.path.isdir(hub) else found)
    for p in doomed:
        remove(store, p)
        out.removed.append(p)
    kept = [p for p in found if p not in doomed]
    hub = os.path.join(store, HUB)
    out.removed += collect_snapshots(store, referenced_snapshots(kept))
    out.freed = before - disk_usage([*kept, hub] if os.path.isdir(hub) else kept)
    return out


def _kept_by(state_dir: str, keep: int) -> dict[str, str]:
    """The realizations the generations in `state_dir` keep (current, held, the last `keep`), and why."""
    records = generations.read_all(state_dir)
    current, hold = generations.current(state_dir), generations.read_hold(state_dir)
    why: dict[str, str] = {}

    def paths_of(g: dict[str, object]) -> list[str]:
        venv, model = g.get("venv"), g.get("model")
        out = [str(venv.get("path"))] if isinstance(venv, dict) and venv.get("path") else []
        return out + ([str(model.get("dir"))] if isinstance(model, dict) and model.get("dir") else [])

    for g in records[-keep:] if keep > 0 else []:
        for p in paths_of(g):
            why.setdefault(p, f"generation {g['generation']} (one of the last {keep})")
    for g in records:
        for p in paths_of(g):
            if g["generation"] == current:
                why[p] = f"generation {current} (current)"
            if hold is not None and g["generation"] == hold.generation:
                why[p] = f"generation {hold.generation} (held)"
    return why
