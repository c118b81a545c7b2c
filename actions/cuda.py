"""Action for CUDA_HOME: point the `/usr/local/cuda` symlink at the toolkit the spec names.

Called by the executor for the `cuda.home` Change. The link is replaced atomically (new link, then
rename), so a process resolving CUDA_HOME meanwhile sees the old toolkit or the new, never nothing.
"""

from __future__ import annotations

import os

from reconcile.errors import ActionError
from reconcile.host import atomic_symlink
from reconcile.plan.records import ActionResult
from reconcile.safety.filesafety import ensure_dir


def point_home(home: str, target: str) -> ActionResult:
    """Make `home` a symlink to `target`; create it when absent, never delete a real directory."""
    if not os.path.isdir(target):
        what = "is not a directory" if os.path.lexists(target) else "does not exist"
        raise ActionError(
            f"cannot point {home} at {target}: {target} {what}; install that toolkit first "
            f"(its cuda-nvcc-* package in [apt].packages) or fix [cuda].target"
        )
    if os.path.islink(home):
        old = os.readlink(home)
        if old == target:
            return ActionResult(False, f"{home} already -> {target}")
        if os.path.realpath(home) == os.path.realpath(target):
            # e.g. /usr/local/cuda -> /etc/alternatives/cuda -> target: keep the admin's indirection.
            return ActionResult(False, f"{home} -> {old} already resolves to {target}")
        atomic_symlink(target, home)
        return ActionResult(True, f"{home} -> {old} => {target}")
    if os.path.isdir(home):
        raise ActionError(
            f"{home} is a real directory, not a symlink; reconcile never deletes it: move it aside "
            f"(e.g. mv {home} {home}-<version>) and re-run to link {home} -> {target}"
        )
    if os.path.lexists(home):
        raise ActionError(f"{home} is a file, not a symlink: move it aside (mv {home} {home}.old) and re-run")
    parent = os.path.dirname(home) or "."
    ensure_dir(parent, 0o755)
    atomic_symlink(target, home)
    return ActionResult(True, f"created {home} -> {target}")
