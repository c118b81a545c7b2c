"""Front probe: the deployment's HAProxy (its config file, its master process, the color it routes
to). Called by reconcile.plan.prober when the spec has [server]: without [front], it finds our HAProxy
that still serves the deployment (reconcile.ownership.membership.former_front), which apply then
takes away."""

from __future__ import annotations

from reconcile.identity import active_color, front_paths
from reconcile.ownership.membership import former_front, front_master
from reconcile.record import Record
from reconcile.safety import statefiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


class FrontObservation(Record):
    config: str | None  # the config file's text; None: absent
    master: int | None  # our HAProxy master's pid; None: not running
    active: str  # "blue" or "green": the color it routes to


def probe(spec: Spec) -> FrontObservation | None:
    """With [front]: its HAProxy. Without: our HAProxy that still serves the deployment from before
    [front] was taken out (None when there is none: nothing to take away)."""
    if getattr(spec, "front", None) is None:
        was = former_front(spec)
        if was is None:
            return None
        spec = was
    config, _pidfile, _sock = front_paths(spec)
    raw = statefiles.read_state(config, max_bytes=65536)
    text = raw.decode(errors="replace") if raw is not None else None
    return FrontObservation(text, front_master(spec), active_color(spec))
