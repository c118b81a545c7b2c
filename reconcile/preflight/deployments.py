"""Preflight across a machine's deployments: what no one deployment's own rules can see.

Called by reconcile.apply.machine for `plan`/`apply`/`status` of a spec with [deployments]. Each
GPU's claims are summed: vLLM's gpu-memory-utilization is a fraction of the whole GPU per instance
(its worker refuses to start when less than that is free), so the fractions of every deployment
placed on a GPU, plus what other processes hold there, must stay within it. Ports and served names
must not collide; tensor x pipeline parallel must match the GPUs a deployment may use.
"""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.spec.deployments import Deployment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (vllm/config/cache.py)
_WILDCARD = ("0.0.0.0", "::", "")


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _world(args: dict[str, Any]) -> int:
    tp = int(_number(args.get("tensor-parallel-size", args.get("tp")), 1))
    pp = int(_number(args.get("pipeline-parallel-size", args.get("pp")), 1))
    return max(tp, 1) * max(pp, 1)


def _placement(d: Deployment, args: dict[str, Any], visible: int | None) -> tuple[int, ...] | None:
    """The GPUs a deployment's workers use: the first TP x PP of those it may use."""
    if d.gpus is not None:
        return d.gpus[: _world(args)] or d.gpus
    if visible is None:
        return None
    return tuple(range(min(visible, _world(args))))


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
    out += _ports(servers) + _served_names(servers)
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
        world = _world(server.args)
        if d.gpus is not None and len(d.gpus) != world:
            out.append(
                Finding(
                    "deployments.gpus",
                    "error",
                    f"deployment {d.name}: tensor x pipeline parallel is {world}, but it may use "
                    f"{len(d.gpus)} GPU(s) (gpus = {list(d.gpus)})",
                    f"give it {world} GPU(s) in [deployments.{d.name}] gpus, or set tensor-parallel-size "
                    f"= {len(d.gpus)}",
                )
            )
        share = _number(server.args.get("gpu-memory-utilization"), DEFAULT_UTILIZATION)
        for index in _placement(d, server.args, count) or ():
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
    return out


def _ports(servers: list[tuple[str, Any]]) -> list[Finding]:
    out = []
    seen: dict[int, tuple[str, str]] = {}
    for name, server in servers:
        host = server.host
        if server.port in seen:
            other, other_host = seen[server.port]
            if host == other_host or host in _WILDCARD or other_host in _WILDCARD:
                out.append(
                    Finding(
                        "deployments.port",
                        "error",
                        f"deployments {other} and {name} both listen on port {server.port}",
                        f"give [deployments.{name}.server] port another number",
                    )
                )
                continue
        seen[server.port] = (name, host)
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
