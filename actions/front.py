"""Action for the `front` resource: the deployment's HAProxy in the state the spec and the active
color say: its config in place (checked by `haproxy -c`), running, reloaded gracefully on a change.
Called by the executor through reconcile.resources.front."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actions import haproxy
from reconcile.identity import active_color
from reconcile.ownership.membership import front_master
from reconcile.plan.records import ActionResult
from reconcile.spec.fronting import shared_front

if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def apply(spec: Spec) -> ActionResult:
    assert spec.server is not None
    shared = shared_front(spec)
    if (shared is None and not spec.server.running) or (shared is not None and not shared.members):
        pid = front_master(spec)
        if pid is None:
            return ActionResult(False, "haproxy is not running")
        haproxy.stop(spec, pid)
        return ActionResult(True, f"stopped haproxy (master pid {pid})")
    color = active_color(spec)
    changed = haproxy.write_config(spec, haproxy.render(spec, color))
    haproxy.write_active(spec, color)
    pid = front_master(spec)
    if pid is None:
        pid = haproxy.start(spec)
        return ActionResult(True, f"started haproxy (master pid {pid}), routing to {color}")
    if changed:
        haproxy.reload(spec, pid)
        return ActionResult(True, f"reloaded haproxy (master pid {pid}) with the new config")
    return ActionResult(False, f"haproxy (master pid {pid}) runs with this config")
