"""The front's part of the plan: HAProxy in front of the server ([front]), its config and process.

Declares the front kind and its probe (probes.front); action: actions.front. The server's blue/green
switch (actions.bluegreen) moves its traffic; this row keeps the process and the config as they
must be.
"""

from __future__ import annotations

from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, change, needs, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from probes.front import FrontObservation
    from reconcile.resources import Observed
    from reconcile.spec.fronting import SharedFront
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def plan_front(spec: Spec, obs: Observed) -> Item | None:
    if spec.server is None:
        return None
    if getattr(spec, "front", None) is None:
        return _plan_taken_away(spec, obs)
    from actions.haproxy import render
    from probes.front import FrontObservation
    from reconcile.identity import color_spec, endpoint_text
    from reconcile.spec.fronting import shared_front

    seen = obs.front
    if not isinstance(seen, FrontObservation):
        why = f"cannot be checked: {getattr(seen, 'reason', seen)}"
        return change(Action.CHANGE, why, "the probe failed", actionable=False)
    where = f"{spec.server.host}:{spec.server.port}"
    shared = shared_front(spec)
    if shared is not None:
        return _plan_shared(spec, seen, shared, where)
    if not spec.server.running:
        if seen.master is None:
            return ok("haproxy stopped, as [server] running = false says")
        return change(
            Action.REMOVE, f"stop haproxy (pid {seen.master}) on {where}", "the spec says running = false"
        )
    to = f"{seen.active} ({endpoint_text(color_spec(spec, seen.active))})"
    if seen.master is None:
        return change(Action.CREATE, f"start haproxy on {where}, routing to {to}", "no HAProxy of ours runs",
                      (FieldDiff("haproxy", "(not running)", where),))  # fmt: skip
    if seen.config != render(spec, seen.active):
        return change(Action.CHANGE, f"rewrite the haproxy config and reload it gracefully ({where} -> {to})",
                      "its config is not the one the spec makes")  # fmt: skip
    return ok(f"haproxy (pid {seen.master}) on {where} routes to {to}")


def _plan_taken_away(spec: Spec, obs: Observed) -> Item | None:
    """No [front], but our HAProxy still serves the deployment: it goes, its colors drain and stop
    first (actions.front.take_away); with running = true the plain server then starts on the port."""
    from probes.front import FrontObservation

    seen = obs.front
    if not isinstance(seen, FrontObservation) or seen.master is None:
        return None
    assert spec.server is not None
    where = f"{spec.server.host}:{spec.server.port}"
    then = (
        f"{spec.server.name} then serves on {where} itself"
        if spec.server.running
        else "[server] running = false"
    )
    name = spec.server.name
    if f"\nbackend vllm-{name}\n" in (seen.config or ""):  # the machine's one HAProxy, shared
        return change(
            Action.REMOVE,
            f"take {name} out of the machine's haproxy (pid {seen.master}) and reload it gracefully, "
            f"after {name}'s colors drain and stop",
            f"the spec has no front for {name}; {then}",
            (FieldDiff("haproxy", f"routes {where}", "(let go)"),),
        )
    return change(
        Action.REMOVE,
        f"stop haproxy (pid {seen.master}) on {where}, after {name}'s colors drain and stop",
        f"the spec has no [front]; {then}",
        (FieldDiff("haproxy", f"pid {seen.master}", "(stopped)"),),
    )


def _plan_shared(spec: Spec, seen: FrontObservation, shared: SharedFront, where: str) -> Item:
    """The machine's one HAProxy, from this deployment's view: the whole config (every fronted
    deployment's frontend) as the spec and each one's active color make it."""
    from actions.haproxy import render
    from reconcile.identity import color_spec, endpoint_text

    assert spec.server is not None
    if not shared.members:
        if seen.master is None:
            return ok("haproxy stopped: no deployment behind it runs")
        return change(Action.REMOVE, f"stop haproxy (pid {seen.master})", "no deployment behind it runs")
    if spec.server.running:
        to = f"{where} -> {seen.active} ({endpoint_text(color_spec(spec, seen.active))})"
    else:
        to = f"{where} let go: {spec.server.name} is stopped"
    names = ", ".join(m.deployment for m in shared.members)
    if seen.master is None:
        what = f"start the machine's haproxy for {names} ({to})"
        diff = FieldDiff("haproxy", "(not running)", names)
        return change(Action.CREATE, what, "no HAProxy of ours runs", (diff,))
    if seen.config != render(spec, seen.active):
        return change(Action.CHANGE, f"rewrite the machine's haproxy config and reload it gracefully ({to})",
                      f"its config is not the one the spec makes for {names}")  # fmt: skip
    return ok(f"the machine's haproxy (pid {seen.master}) for {names}: {to}")


def perform(loaded: LoadedSpec, change: Change, progress: Callable[[str], None]) -> ActionResult:
    from actions import front

    return front.apply(loaded.spec)


# Probed wherever there is a [server]: without [front] it finds our HAProxy that still serves it.
PROBES = (Probe("front", "probes.front", "server", tags={"FrontObservation": "front"}),)
KINDS = (Kind("front", "front", ("front",), plan_front, perform, needs("server")),)
