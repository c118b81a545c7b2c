"""Desired (Spec) vs observed (probes) -> Plan: each declared row (reconcile.resources), in its order.

Called by `reconcile plan`, by the executor (whole plan, then `replan_resource` right before and
after each action) and by status. Pure apart from running the probes it is asked to run.
"""

from __future__ import annotations

import _socket  # gethostname itself: socket.py costs ~3-4 ms to import
from collections.abc import Iterator, Mapping

from reconcile.errors import ReconcileError
from reconcile.plan.prober import Observed, probe_all, probe_some
from reconcile.plan.records import Action, Change, Item, Plan
from reconcile.resources import BY_NAME, TABLE
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.resources.common import Kind
    from reconcile.spec.models import Spec


def _stamped(row: Kind, spec: Spec, item: Item) -> Item:
    """The item as the row's: its name, and on a Change the row's dependencies (the row declares them)."""
    if isinstance(item, Change):
        return item._replace(resource=row.name, depends_on=row.depends_on(spec))
    return item._replace(resource=row.name)


def _planned(row: Kind, spec: Spec, obs: Observed) -> Item | None:
    """The row's planner's item, stamped as the row's."""
    item = row.plan(spec, obs)
    return None if item is None else _stamped(row, spec, item)


def plan_items(spec: Spec, obs: Observed) -> list[Item]:
    planned = [(row, item) for row in TABLE if (item := _planned(row, spec, obs)) is not None]
    # What the server's launch identity covers and apply will change: a fine server restarts after it.
    pending = [
        row.name
        for row, item in planned
        if row.restarts_server and isinstance(item, Change) and item.actionable
    ]
    return [
        item if row.after_plan is None else _stamped(row, spec, row.after_plan(item, spec, obs, pending))
        for row, item in planned
    ]


def remember(spec: Spec, obs: Observed) -> None:
    """Each row's `remember` (apply's first plan only, under the lock: plan itself writes nothing)."""
    for row in TABLE:
        if row.remember is not None:
            row.remember(spec, obs)


def make_plan(loaded: LoadedSpec, observed: Observed | None = None) -> Plan:
    from reconcile.preflight.gather import findings_for
    from reconcile.spec.origin import git_info
    from reconcile.threads import Background

    spec = loaded.spec
    git_job = Background(lambda: git_info(loaded.files), "git")
    obs = observed if observed is not None else probe_all(spec)
    items = plan_items(spec, obs)
    findings = findings_for(spec, obs)
    git = git_job.result()
    notes = []
    host = _socket.gethostname()
    if spec.machine.hostname and spec.machine.hostname != host:
        notes.append(f"this spec is for host {spec.machine.hostname}; running on {host}")
    if git.dirty:
        at = git.commit and git.commit[:12]
        notes.append(f"{loaded.path} has uncommitted changes (plan reflects the file, not {at})")
    from reconcile.spec.pins import lock_notes
    from reconcile.unattended.pause import pause_notes

    notes += lock_notes(loaded) + pause_notes(spec.machine.state_dir) + store_notes(loaded)

    return Plan(
        loaded.path,
        host,
        loaded.sha256,
        git.describe(),
        tuple(items),
        tuple(findings),
        tuple(notes),
        _ObservedData(obs),
    )


def store_notes(loaded: LoadedSpec) -> list[str]:
    """What is left out of the store (reconcile.apply.store.realize): all of it with `store = false`;
    a venv or model dir that was a real directory before the store, used in place."""
    from reconcile.apply.store import in_place, spec_store

    spec, doc = loaded.spec, loaded.resolved
    venv_doc, model_doc = doc.get("venv") or {}, doc.get("model") or {}
    if not venv_doc and not model_doc:
        return []
    if venv_doc.get("store") is False:
        return [
            "[venv] store = false: nothing is realized; a rollback reinstalls the venv's packages (from "
            "the index) and changes the model's files in place (copied or downloaded again; a local "
            "source edited since cannot be restored)"
        ]
    from reconcile.apply.store import not_root

    if venv_doc.get("store") is None and (user := not_root(spec)):
        return [
            f"[server] user = {user} cannot enter {spec.machine.state_dir} (0700), where the store "
            "would be: nothing is realized; set [venv] store to a directory it can read"
        ]
    out = []
    for what, written, now in (
        ("[venv] path", venv_doc.get("path"), spec.venv and spec.venv.path),
        ("[model] dir", model_doc.get("dir"), spec.model and spec.model.dir),
    ):
        if (
            written
            and written == now
            and in_place(written, spec_store(spec))
            and not (what == "[venv] path" and venv_doc.get("store"))
        ):
            out.append(
                f"{what} {written} was made before the store: used in place, not realized (a rollback "
                "changes it in place); move it away and apply to have it realized in the store"
            )
    return out


class _ObservedData(Mapping[str, object]):  # values: JSON data (Any to the readers)
    """The probes' results as JSON-able data, each converted when first read: a text plan reads none
    (a 500-package venv's conversion was ~6 ms of every plan). Keys in plan-json's order."""

    def __init__(self, obs: Observed) -> None:
        self._obs = obs
        self._done: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._obs._fields:
            raise KeyError(name)
        if name not in self._done:
            from reconcile.plan.render import _jsonable

            self._done[name] = _jsonable(getattr(self._obs, name))
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        from reconcile.plan.jsondata import observed_keys

        return iter(observed_keys(self._obs._fields))

    def __len__(self) -> int:
        return len(self._obs._fields)


def replan_resource(loaded: LoadedSpec, resource: str) -> Change | None:
    """Probe what `resource` depends on now and plan it alone: None when it already matches.

    A probe or planner that raises becomes a Change apply cannot make, so the executor records a
    failure for this resource instead of losing the report of what it already did."""
    spec = loaded.spec
    row = BY_NAME[resource]
    try:
        item = _planned(row, spec, probe_some(spec, row.probes))
    except Exception as exc:
        what = str(exc) if isinstance(exc, ReconcileError) else f"{type(exc).__name__}: {exc}"
        return Change(
            resource, Action.CHANGE, f"cannot be checked: {what}", "re-planning it failed", actionable=False
        )
    return item if isinstance(item, Change) else None


def resolved_versions(loaded: LoadedSpec) -> dict[str, Any]:
    """What a generation records as resolved: installed package versions, the model commit and the
    running server's launch identity."""
    from probes.model import DownloadRecord, ModelObservation
    from probes.venv import VenvObservation

    spec = loaded.spec
    obs = probe_some(spec, ("venv", "model", "server"))
    out: dict[str, Any] = {}
    if isinstance(obs.venv, VenvObservation) and spec.venv is not None:
        out["packages"] = {name: obs.venv.version_of(name) for name in spec.venv.packages}
    if isinstance(obs.model, ModelObservation) and isinstance(obs.model.record, DownloadRecord):
        out["model_commit"] = obs.model.record.commit
    if spec.server is not None:
        out["server_identity"] = getattr(obs.server, "running_identity", None)
    return out
