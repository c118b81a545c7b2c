"""Preflight across a machine's deployments: what no one deployment's own rules can see.

Called by reconcile.apply.machine for `plan`/`apply`/`status` of a spec with [deployments]. Each
GPU's claims are summed: vLLM's gpu-memory-utilization is a fraction of the whole GPU per instance
(its worker refuses to start when less than that is free), so the fractions of every deployment
placed on a GPU, plus what other processes hold there, must stay within it. Ports and served names
must not collide; tensor x pipeline parallel must match the GPUs a deployment may use.
"""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.record import Record
from reconcile.spec.deployments import Deployment
from reconcile.spec.fronting import DEFAULT_UTILIZATION, both_colors, number, placement, shared_front, world

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WILDCARD = ("0.0.0.0", "::", "")


def _others_gib(gpu: Any, ours: set[int]) -> float:
    """GiB that processes not of these deployments hold on `gpu` (0 when NVML cannot list them)."""
    processes = getattr(gpu, "processes", ())
    if not isinstance(processes, tuple):
        return 0.0
    held = sum(p.used_memory or 0 for p in processes if p.pid not in ours)
    return float(held) / 2**30


def cross_findings(
    every: list[Deployment], inventory: Any = None, ours: set[int] | None = None
) -> list[Finding]:
    """Findings for the machine: `inventory` is the gpu probe's GpuInventory (None: no GPU probed),
    `ours` the pids of these deployments' processes (their GPU memory is theirs to give back)."""
    out: list[Finding] = []
    servers = [(d.name, d.loaded.spec.server) for d in every if d.loaded.spec.server is not None]
    out += _ports(every) + _served_names(servers)
    gpus = getattr(inventory, "gpus", None)
    count = len(gpus) if gpus is not None else None
    spec_gpu = getattr(every[0].loaded.spec, "gpu", None) if every else None
    if count is None and spec_gpu is not None:
        count = spec_gpu.count
    claims: dict[int, list[tuple[str, float]]] = {}
    for d in every:
        server = d.loaded.spec.server
        if server is None or not getattr(server, "running", True):
            continue
        workers = world(server.args)
        if d.gpus is not None and len(d.gpus) != workers:
            out.append(
                Finding(
                    "deployments.gpus",
                    "error",
                    f"deployment {d.name}: tensor x pipeline parallel is {workers}, but it may use "
                    f"{len(d.gpus)} GPU(s) (gpus = {list(d.gpus)})",
                    f"give it {workers} GPU(s) in [deployments.{d.name}] gpus, or set tensor-parallel-size "
                    f"= {len(d.gpus)}",
                )
            )
        share = number(server.args.get("gpu-memory-utilization"), DEFAULT_UTILIZATION)
        for index in placement(d.gpus, server.args, count) or ():
            claims.setdefault(index, []).append((d.name, share))
    for index in sorted(claims):
        parts = claims[index]
        total = sum(share for _, share in parts)
        gpu = gpus[index] if gpus is not None and index < len(gpus) else None
        others = _others_gib(gpu, ours or set()) if gpu is not None else 0.0
        size = float(gpu.memory_total) / 2**30 if gpu is not None else None
        free_share = 1.0 - (others / size if size else 0.0)
        terms = " + ".join(f"{share:g} ({name})" for name, share in parts)
        evidence = {"gpu": index, "sum": round(total, 4), "claims": dict(parts)}
        if len(parts) < 2 and others == 0.0:
            continue  # one deployment's fraction alone is its own rules' business
        if total > free_share + 1e-9:
            held = f"; other processes hold {others:.1f} GiB of {size:.1f}" if others else ""
            out.append(
                Finding(
                    "memory.shared_gpu",
                    "error",
                    f"GPU {index}: gpu-memory-utilization sums to {total:g} = {terms}, over "
                    f"{free_share:.2f} of the GPU{held}",
                    "lower the deployments' gpu-memory-utilization so that they sum to at most "
                    f"{free_share:.2f} on GPU {index}, or place one on another GPU (gpus = [...])",
                    evidence,
                )
            )
        else:
            out.append(
                Finding(
                    "memory.shared_gpu",
                    "info",
                    f"GPU {index}: gpu-memory-utilization sums to {total:g} = {terms}; fits",
                    evidence=evidence,
                )
            )
    return out + _blue_green_room(every)


def _blue_green_room(every: list[Deployment]) -> list[Finding]:
    """Per fronted deployment: whether its switch can run both colors beside every other deployment's
    share on its GPUs (the server row's answer, from the spec alone); where not, it drain-restarts."""
    out = []
    for d in every:
        shared, server = shared_front(d.loaded.spec), d.loaded.spec.server
        if shared is None or server is None or not server.running:
            continue
        if getattr(d.loaded.spec.front, "blue_green", "auto") == "never":
            continue
        placed = next((c.gpus for c in shared.claims if c.deployment == d.name), None)
        if not placed:
            continue
        share = number(server.args.get("gpu-memory-utilization"), DEFAULT_UTILIZATION)
        fits, why = both_colors(d.name, share, placed, shared.claims)
        evidence = {"deployment": d.name, "fits": fits}
        if fits:
            out.append(Finding("front.room", "info", f"deployment {d.name} switches blue/green: {why}",
                               evidence=evidence))  # fmt: skip
        else:
            out.append(
                Finding(
                    "front.room",
                    "warning",
                    f"deployment {d.name} switches by drain-restart, not blue/green: {why}",
                    f"lower the gpu-memory-utilization on GPU {placed[0]} so that {d.name}'s counts "
                    f'twice, or set [deployments.{d.name}.front] blue_green = "never" to say so',
                    evidence,
                )
            )
    return out


class _Port(Record):
    port: int
    host: str
    deployment: str
    key: tuple[str | int, ...]  # where the spec sets it (or the section whose default it is)
    what: str  # "its server's port", "its public port (HAProxy)"


def _listeners(d: Deployment) -> list[_Port]:
    """Every port a deployment listens on: its server's, or behind the front its public one (its colors
    serve on Unix sockets of their own: reconcile.identity.color_socket)."""
    spec = d.loaded.spec
    server = spec.server
    if server is None:
        return []
    base = ("deployments", d.name)
    front = getattr(spec, "front", None)
    if front is None or shared_front(spec) is None:
        return [_Port(server.port, server.host, d.name, (*base, "server", "port"), "its server's port")]
    return [_Port(server.port, server.host, d.name, (*base, "server", "port"), "its public port (HAProxy)")]


def _where(d: Deployment, key: tuple[str | int, ...]) -> tuple[str, int | None, str]:
    """(file, line, key): the line of the key, or of its table, in the spec's own file."""
    from reconcile.spec.lines import Scan, dotted

    lines = Scan(d.loaded.text).lines
    found = next((lines[dotted(key[:n])] for n in range(len(key), 0, -1) if dotted(key[:n]) in lines), None)
    return d.loaded.path, found, dotted(key)


def _ports(every: list[Deployment]) -> list[Finding]:
    """Two deployments that would listen on one port (a wildcard host collides with every host): their
    servers' ports, behind the front its public port."""
    out = []
    seen: dict[int, list[tuple[_Port, Deployment]]] = {}
    for d in every:
        for p in _listeners(d):
            clash = next(
                (
                    (q, other)
                    for q, other in seen.get(p.port, [])
                    if q.deployment != p.deployment  # its own ports are held apart at load
                    and (p.host == q.host or p.host in _WILDCARD or q.host in _WILDCARD)
                ),
                None,
            )
            if clash is None:
                seen.setdefault(p.port, []).append((p, d))
                continue
            q, other = clash
            if p.what == q.what == "its server's port":
                said = f"deployments {q.deployment} and {p.deployment} both listen on port {p.port}"
            else:
                said = f"port {p.port} is {p.what} and deployment {q.deployment}'s {q.what[4:]}"
            path, line, key = _where(d, p.key)
            _, other_line, other_key = _where(other, q.key)
            at = f"{path}:{line}" if line is not None else path
            said += f" ({other_key}" + (f", line {other_line})" if other_line is not None else ")")
            fix = f"[deployments.{p.deployment}.server] port"
            message = f"{at}: {key}: {said}"
            fix_line = f"give {fix} another number, or move {q.deployment}'s"
            out.append(Finding("deployments.port", "error", message, fix_line))
    return out


def _served_names(servers: list[tuple[str, Any]]) -> list[Finding]:
    out = []
    seen: dict[str, str] = {}
    for name, server in servers:
        served = server.served_model_name or server.model
        if served is None:
            continue
        if served in seen:
            out.append(
                Finding(
                    "deployments.served_model_name",
                    "error",
                    f"deployments {seen[served]} and {name} both serve the model name {served!r}",
                    f"give [deployments.{name}.server] served_model_name another name",
                )
            )
        seen[served] = name
    return out
