"""Several deployments behind the machine's one HAProxy: what a deployment's view carries about the
front it shares (where its config, pidfile and socket live; every fronted deployment's frontend; every
deployment's GPU claims), and the per-GPU sum that decides whether a blue/green switch has room.

Built by reconcile.spec.deployments (the views); read by reconcile.identity, actions.haproxy, the
blue/green planner and the preflight across deployments. Plain records: a warm plan needs no pydantic.
"""

from __future__ import annotations

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_HAPROXY = "/usr/sbin/haproxy"
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (vllm/config/cache.py)


class FrontMember(Record):
    """One fronted deployment's frontend and backend in the shared config."""

    deployment: str
    server: str  # the server's name: the frontend's, and the backend's as vllm-<server>
    host: str
    port: int  # the public port HAProxy binds
    state_dir: str  # the deployment's: its front-<server>.json says the active color; its colors'
    # sockets are named by it (reconcile.identity.color_socket)
    stop_timeout: float


class GpuClaim(Record):
    """A running deployment's gpu-memory-utilization on the GPUs it is placed on."""

    deployment: str
    gpus: tuple[int, ...] | None  # None: not known (no gpus = [...] and no GPU count)
    share: float


class SharedFront(Record):
    state_dir: str  # the machine's: front.cfg, front.pid, front.sock, front.log
    members: tuple[FrontMember, ...]  # every fronted deployment, in the spec's order
    claims: tuple[GpuClaim, ...]  # every running deployment's


class FrontView(Record):
    """A fronted deployment's view of [front]: what a one-deployment [front] holds, plus the shared part."""

    haproxy: str
    ports: list[int]
    blue_green: str
    deployment: str
    shared: SharedFront


def shared_front(spec: Any) -> SharedFront | None:
    """The machine's shared front when `spec` is a fronted deployment of a spec with [deployments]."""
    shared = getattr(getattr(spec, "front", None), "shared", None)
    return shared if isinstance(shared, SharedFront) else None


def number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def world(args: dict[str, Any]) -> int:
    tp = int(number(args.get("tensor-parallel-size", args.get("tp")), 1))
    pp = int(number(args.get("pipeline-parallel-size", args.get("pp")), 1))
    return max(tp, 1) * max(pp, 1)


def placement(
    gpus: tuple[int, ...] | None, args: dict[str, Any], visible: int | None
) -> tuple[int, ...] | None:
    """The GPUs a deployment's workers use: the first TP x PP of those it may use."""
    if gpus is not None:
        return gpus[: world(args)] or gpus
    if visible is None:
        return None
    return tuple(range(min(visible, world(args))))


def share_of(server: Any) -> float:
    return number(server.args.get("gpu-memory-utilization"), DEFAULT_UTILIZATION)


def both_colors(
    name: str, share: float, gpus: tuple[int, ...], claims: tuple[GpuClaim, ...]
) -> tuple[bool, str]:
    """(fits, why): per GPU the switching deployment uses, its share twice (old and new color side by
    side) plus every other running deployment's share there, against the whole GPU."""
    said = "no GPU placement known"
    for index in gpus:
        others = [(c.deployment, c.share) for c in claims if c.deployment != name and index in (c.gpus or ())]
        total = 2 * share + sum(s for _, s in others)
        terms = " + ".join([f"{share:g} x 2 ({name} blue + green)", *(f"{s:g} ({n})" for n, s in others)])
        if total > 1.0 + 1e-9:
            return False, f"GPU {index}: gpu-memory-utilization {terms} = {total:g}, over 1.00 of the GPU"
        if index == gpus[0]:
            said = f"GPU {index}: gpu-memory-utilization {terms} = {total:g}; fits"
    return True, said
