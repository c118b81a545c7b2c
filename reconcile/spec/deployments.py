"""A spec's deployments, each as a spec of its own: the machine part and that deployment's sections.

Called by the commands (plan, apply, status, check) and the cross-deployment preflight. Each view is
planned and applied by the same per-resource code as a spec of today; its state (generations, the
server's records and cgroup, conditions, pause) lives in <state_dir>/deployments/<name>/, so its
ownership is its own. A spec without [deployments] is one deployment, "default", unchanged.
Plain data, no pydantic: a warm plan reads the spec cache's views.
"""

from __future__ import annotations

import json
import os

from reconcile.errors import ReconcileError
from reconcile.record import Record
from reconcile.spec.fronting import (
    DEFAULT_HAPROXY,
    FrontMember,
    FrontView,
    GpuClaim,
    SharedFront,
    placement,
    share_of,
)
from reconcile.spec.loaded import LoadedSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT = "default"  # the name of a spec's one deployment when it has no [deployments]
_SECTIONS = ("venv", "model", "api_key", "server")  # what a deployment holds; the rest is the machine's


class Deployment(Record):
    name: str
    loaded: LoadedSpec  # the deployment as a one-deployment spec (the spec itself for "default")
    gpus: tuple[int, ...] | None  # the GPUs it may use (None: every GPU)


def is_multi(loaded: LoadedSpec) -> bool:
    return bool(getattr(loaded.spec, "deployments", None))


def state_dir_of(machine_state_dir: str, name: str) -> str:
    return os.path.join(machine_state_dir, "deployments", name)


def deployments(loaded: LoadedSpec) -> list[Deployment]:
    """Every deployment of the spec, in the spec's order."""
    spec = loaded.spec
    tables = getattr(spec, "deployments", None) or {}
    if not tables:
        return [Deployment(DEFAULT, loaded, None)]
    out = []
    resolved_tables = loaded.resolved.get("deployments") or {}
    shared = _shared_front(spec, tables)
    for name, table in tables.items():
        server = table.server
        env_update: dict[str, str] = {}
        if table.gpus is not None:
            env_update["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in table.gpus)
            server = server.model_copy(update={"env": {**server.env, **env_update}})
        state_dir = state_dir_of(spec.machine.state_dir, name)
        view = spec.model_copy(
            update={
                "machine": spec.machine.model_copy(update={"state_dir": state_dir}),
                "venv": table.venv if table.venv is not None else spec.venv,
                "model": table.model,
                "api_key": table.api_key if table.api_key is not None else spec.api_key,
                "server": server,
                "front": _front_view(spec, table, name, shared),
                "deployments": {},
            }
        )
        resolved = _resolved_view(
            loaded.resolved, resolved_tables.get(name) or {}, name, state_dir, env_update
        )
        out.append(
            Deployment(
                name, loaded._replace(spec=view, resolved=resolved, sha256=_digest(resolved)), _gpus(table)
            )
        )
    return out


def _shared_front(spec: Any, tables: dict[str, Any]) -> SharedFront | None:
    """The machine's one HAProxy: every fronted deployment's frontend, every running one's GPU claim."""
    if not any(getattr(t, "front", None) is not None for t in tables.values()):
        return None
    members, claims = [], []
    count = spec.gpu.count if getattr(spec, "gpu", None) is not None else None
    for name, table in tables.items():
        server = table.server
        if getattr(server, "running", True):
            claims.append(GpuClaim(name, placement(_gpus(table), server.args, count), share_of(server)))
        if table.front is None or not getattr(server, "running", True):
            continue  # a stopped deployment has no frontend: its public port is let go
        state_dir = state_dir_of(spec.machine.state_dir, name)
        stop = float(server.stop_timeout)
        members.append(FrontMember(name, server.name, server.host, server.port, state_dir, stop))
    return SharedFront(spec.machine.state_dir, tuple(members), tuple(claims))


def _front_view(spec: Any, table: Any, name: str, shared: SharedFront | None) -> FrontView | None:
    front = getattr(table, "front", None)
    if front is None or shared is None:
        return None
    machine = getattr(spec, "front", None)
    blue_green = front.blue_green or (machine.blue_green if machine is not None else "auto")
    haproxy = machine.haproxy if machine is not None else DEFAULT_HAPROXY
    return FrontView(haproxy, list(front.ports), blue_green, name, shared)


def _gpus(table: Any) -> tuple[int, ...] | None:
    return None if table.gpus is None else tuple(table.gpus)


def _resolved_view(
    whole: dict[str, Any], table: dict[str, Any], name: str, state_dir: str, env: dict[str, str]
) -> dict[str, Any]:
    """The deployment's document in today's one-deployment form: what its generations record (and a
    rollback of it loads back)."""
    doc = {k: v for k, v in whole.items() if k not in ("deployments", "front")}
    doc["machine"] = {**(doc.get("machine") or {}), "state_dir": state_dir}
    if "front" in table:  # its [front] as a one-deployment spec has it: the machine's, with its own
        doc["front"] = {**(whole.get("front") or {}), **table["front"]}
    for section in _SECTIONS:
        if section in table:
            doc[section] = table[section]
    server = {"name": name, **(doc.get("server") or {})}
    if env:
        server["env"] = {**(server.get("env") or {}), **env}
    doc["server"] = server
    return doc


def _digest(resolved: dict[str, Any]) -> str:
    import hashlib

    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def chosen(loaded: LoadedSpec, name: str | None) -> list[Deployment]:
    """The deployment `name` (or all of them when None); an unknown name is a one-line error."""
    every = deployments(loaded)
    if name is None:
        return every
    picked = [d for d in every if d.name == name]
    if not picked:
        names = ", ".join(d.name for d in every)
        raise ReconcileError(f"{loaded.path}: no deployment {name!r} (the spec has: {names})")
    return picked
