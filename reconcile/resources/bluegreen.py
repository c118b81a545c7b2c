"""Blue/green switches of a server behind [front] (HAProxy): whether the GPUs hold the new server
beside the old one (the plan's answer, on the server row), and the switch itself: start the new color
on its own socket, readiness, acceptance, move the front's traffic, then drain and stop the old color.

Called by reconcile.resources.server (its planner and its perform). Where there is no room, or no
front runs yet, the server row drain-restarts the active color in place instead.
"""

from __future__ import annotations

import time

from reconcile.plan.records import ActionResult, Change, FieldDiff
from reconcile.spec.fronting import both_colors, share_of, shared_front

TYPE_CHECKING = False
if TYPE_CHECKING:
    from actions.launching import LaunchInputs
    from actions.supervising import ProgressFn
    from reconcile.resources import Observed
    from reconcile.spec.models import Spec

GiB = 1024**3
FIELD = "switch"
BLUE_GREEN = "blue/green"


def room(spec: Spec, obs: Observed) -> tuple[bool, str]:
    """(whether both generations fit beside each other, why): per GPU the server uses, the memory
    free now (the old server's already taken) against what the new one asks (utilization x total)."""
    front, server = getattr(spec, "front", None), spec.server
    assert front is not None and server is not None
    if front.blue_green == "never":
        return False, "[front] blue_green = never"
    if getattr(obs.front, "master", None) is None:
        return False, "no HAProxy of ours runs yet to move the traffic"
    gpus = getattr(obs.gpu, "gpus", None)
    shared, summed = shared_front(spec), ""
    placed: tuple[int, ...] | None = None
    if shared is not None:  # beside other deployments: their shares on the same GPUs count too
        me = getattr(front, "deployment", "")
        placed = next((c.gpus for c in shared.claims if c.deployment == me), None)
        if placed:
            fits, summed = both_colors(me, share_of(server), placed, shared.claims)
            if not fits:
                return False, summed
    if not gpus:
        if spec.gpu is None:
            return True, summed or "no GPU in the spec: nothing to share"
        return False, "GPU memory was not probed (NVML unavailable): cannot know both fit"
    util = float(str(server.args.get("gpu-memory-utilization", 0.9)))
    world = 1
    for flag in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        world *= int(str(server.args.get(flag, 1)))
    by_index = sorted(gpus, key=lambda g: g.index)
    used = [g for g in by_index if g.index in placed] if placed else by_index[:world]
    for g in used:
        need = g.memory_total * util
        if g.memory_free < need:
            return False, (
                f"GPU {g.index}: {g.memory_free / GiB:.1f} GiB free beside the old server, the new one "
                f"asks {need / GiB:.1f} GiB (gpu-memory-utilization {util:g})"
            )
    if not used:
        return True, summed or "no GPU in use"
    g = used[0]
    need = g.memory_total * util / GiB
    free = f"GPU {g.index}: {g.memory_free / GiB:.1f} GiB free, the new one asks {need:.1f} GiB"
    return True, f"{summed}; {free}" if summed else free


def mark(spec: Spec, obs: Observed) -> FieldDiff:
    """The server row's diff that says how the restart will go."""
    fits, why = room(spec, obs)
    if fits:
        return FieldDiff(FIELD, "drain-restart", f"{BLUE_GREEN} ({why})")
    return FieldDiff(FIELD, BLUE_GREEN, f"drain-restart ({why})")


def wanted(change: Change) -> bool:
    return any(d.field == FIELD and str(d.new).startswith(BLUE_GREEN) for d in change.diffs)


def switch(spec: Spec, inputs: LaunchInputs, progress: ProgressFn | None) -> ActionResult:
    """The new color beside the old: started, ready, accepted, then the traffic moves and the old
    one drains. A new color that fails is stopped and the old one never stopped serving."""
    from actions import haproxy
    from actions import server as server_action
    from probes.health import chat_check
    from reconcile.errors import ActionError
    from reconcile.identity import active_color, color_spec, other_color

    began = time.monotonic()
    old_color = active_color(spec)
    new_color = other_color(old_color)
    old, new = color_spec(spec, old_color), color_spec(spec, new_color)
    started = server_action.ensure_running(new, inputs, progress=progress)
    check = chat_check(new)
    if not check.ok:
        server_action.ensure_stopped(new)
        failed = "; ".join(f"{s.name}: {s.message}" for s in check.steps if not s.ok)
        raise ActionError(
            f"blue/green: {new_color} failed its acceptance check ({failed}); {old_color} still serves"
        )
    ready = time.monotonic() - began
    haproxy.route_to(spec, new_color)
    moved = time.monotonic()
    stopped = server_action.ensure_stopped(old)
    return ActionResult(
        True,
        f"blue/green: {started.message}; accepted after {ready:.1f}s; traffic moved to {new_color}; "
        f"down for 0.0s; {old_color} drained and stopped in {time.monotonic() - moved:.1f}s "
        f"({stopped.message})",
    )
