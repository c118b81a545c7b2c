"""Facts the planners take from elsewhere, so the plan says each once and truly. Called by
reconcile.plan.planner: missing headers whose packages the apt resource installs (the cuda row), and
the config.json a model's local source brings (the model.config row before the copy).
"""

from __future__ import annotations

from collections.abc import Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Model, Spec


def headers_via(spec: Spec, missing: Sequence[str], fields: Sequence[str], release: str | None) -> str | None:
    """ "apt" when headers are all that is missing from the toolkit and [apt] packages lists the package
    of every one: the apt change brings them, the cuda row only waits for it (None otherwise)."""
    from reconcile.engine.failures import header_package

    if not missing or spec.apt is None or any(f != "headers.missing" for f in fields):
        return None
    listed = {p.partition("=")[0] for p in spec.apt.packages}
    packages = [header_package(h, release) for h in missing]
    return "apt" if all(p is not None and p in listed for p in packages) else None


def source_config(model: Model) -> dict[str, Any]:
    """The top-level keys of `[model] source`'s config.json ({} without a local source, or unreadable)."""
    if not model.source:
        return {}
    import json
    import os

    from reconcile.safety.untrusted import JSON_LIMIT, read_regular

    try:  # the source is data from outside: a regular file, non-blocking, bounded (class 2)
        data = json.loads(read_regular(os.path.join(model.source, "config.json"), JSON_LIMIT, follow=True))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
