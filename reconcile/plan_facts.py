"""Which resource owns a fact the planners see twice, so the plan says it once. Called by
reconcile.planning (the cuda planner: missing headers whose packages the apt resource installs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconcile.spec import Spec


def headers_via(spec: Spec, missing: Sequence[str], fields: Sequence[str], release: str | None) -> str | None:
    """ "apt" when headers are all that is missing from the toolkit and [apt] packages lists the package
    of every one: the apt change brings them, the cuda row only waits for it (None otherwise)."""
    from reconcile.engine.failures import header_package

    if not missing or spec.apt is None or any(f != "headers.missing" for f in fields):
        return None
    listed = {p.partition("=")[0] for p in spec.apt.packages}
    packages = [header_package(h, release) for h in missing]
    return "apt" if all(p is not None and p in listed for p in packages) else None
