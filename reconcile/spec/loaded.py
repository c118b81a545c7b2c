"""A validated spec with where it came from: what every command works on.

Built by reconcile.spec.loader (or reconcile.spec.cache); kept apart from reconcile.spec.models so that code
holding one needs no pydantic at import time.
"""

from __future__ import annotations

import os

from reconcile.errors import ReconcileError
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Spec


class LoadedSpec(Record):
    spec: Spec  # a pydantic Spec, or its plain read-only twin from the spec cache (spec_view)
    path: str  # as the user gave it
    text: str  # the main file's own text
    sha256: str  # of `resolved` as canonical JSON: a change in a base file changes it
    files: tuple[str, ...]  # the spec, then every base it extends, absolute
    resolved: dict[str, Any]  # the merged, reference-resolved document that `spec` validates


def find_spec(explicit: str | None, specs_dir: str = "specs", hostname: str | None = None) -> str:
    """`--spec PATH` if given, else specs/<hostname>.toml."""
    if explicit is not None:
        if not os.path.exists(explicit):  # what is there (a FIFO, a link) is the loader's to judge
            raise ReconcileError(f"--spec {explicit}: no such file (give the path of a spec file)")
        return explicit
    if hostname is None:
        import socket

        hostname = socket.gethostname()
    candidate = os.path.join(specs_dir, f"{hostname}.toml")
    if os.path.exists(candidate):
        return candidate
    raise ReconcileError(
        f"no spec: --spec not given and {candidate} does not exist "
        f"(pass --spec PATH, or run `reconcile init` to write {candidate})"
    )
