"""Action for the `front` resource: the deployment's HAProxy in the state the spec and the active
color say: its config in place (checked by `haproxy -c`), running, reloaded gracefully on a change.
Called by the executor through reconcile.resources.front."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actions import haproxy
from reconcile.identity import COLORS, active_color
from reconcile.ownership.membership import front_master
from reconcile.plan.records import ActionResult
from reconcile.spec.fronting import shared_front

if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def apply(spec: Spec) -> ActionResult:
    assert spec.server is not None
    if getattr(spec, "front", None) is None:  # [front] taken out: ours goes (with running = false too)
        said = take_away(spec)
        return ActionResult(bool(said), said or "no haproxy of ours serves it")
    return _apply_fronted(spec)


def take_away(spec: Spec) -> str:
    """A spec without [front] whose deployment our HAProxy (or a color of it) still serves: each color
    drains and stops (its in-flight requests finish through HAProxy), then HAProxy stops and lets the
    public port go. What was done, "" when nothing was there. Ours only: the colors by their marker in
    their own scope, the master as front_master proves it (pidfile, root, apt's haproxy, our config)."""
    from actions import server as server_action
    from actions import supervising
    from reconcile.identity import as_fronted, color_spec, front_paths
    from reconcile.ownership.membership import former_front, scope_of
    from reconcile.safety import statefiles

    was = former_front(spec) or as_fronted(spec)
    said = []
    for color in COLORS:
        each = color_spec(was, color)
        if supervising.marked_pids(scope_of(each)):
            said.append(server_action.ensure_stopped(each).message)
    pid = front_master(was)
    if pid is None:
        return "; ".join(said)
    if shared_front(was) is not None:  # the machine's one HAProxy: only this deployment leaves it
        assert spec.server is not None
        config, _pidfile, _sock = front_paths(was)
        raw = statefiles.read_state(config, max_bytes=65536) or b""
        deployment = str(getattr(was.front, "deployment", ""))
        text = haproxy.without(raw.decode(errors="replace"), spec.server.name, deployment)
        if "\nfrontend " in text:
            haproxy.write_config(was, text)
            haproxy.reload(was, pid)
            _port_let_go(spec.server.host, spec.server.port)
            said.append(f"took {spec.server.name} out of the machine's haproxy (master pid {pid}), reloaded")
            return "; ".join(said)
    haproxy.stop(was, pid)
    said.append(f"stopped haproxy (master pid {pid}): the spec has no [front]")
    return "; ".join(said)


def _port_let_go(host: str, port: int, timeout: float = 10.0) -> None:
    """After a reload without this deployment's frontend, until the old worker has closed its listener
    on `port` where the server's bind of `host` would clash (bounded): the server that serves the port
    next binds it as it starts (vLLM 0.26.0 binds before it builds the engine), and a listener still
    there fails that bind at once. Past the bound the start goes ahead, and a bind that fails is
    diagnosed as a taken port."""
    import time

    from reconcile.ownership.sockets import listening_inodes

    deadline = time.monotonic() + timeout
    while listening_inodes(port, host) and time.monotonic() < deadline:
        time.sleep(0.05)


def _apply_fronted(spec: Spec) -> ActionResult:
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
