"""The server's own cgroup (v2): made before a launch, entered by the child before it execs, emptied with
cgroup.kill and removed after a stop. How systemd tracks a service's processes, without systemd.

Called by actions.server (prepare, Entry) and actions.supervising (empty_and_remove). Where no
cgroup can be made, prepare says why and the launch falls back to recorded (pid, start time, boot id).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from reconcile.errors import RetryableError
from reconcile.ownership import cgroups
from reconcile.record import Record

if TYPE_CHECKING:
    from reconcile.spec.models import Spec


class Prepared(Record):
    """`path`: the cgroup a launch enters (None: fall back); `why`: the path taken, in words."""

    path: str | None
    why: str


def prepare(spec: Spec) -> Prepared:
    """Make <cgroup2>/reconcile/<deployment>/ (0755, ours) unless it exists and is trusted."""
    root, why = cgroups.cgroup_root()
    path = cgroups.cgroup_path(spec)
    if root is None or path is None:
        return Prepared(None, why)
    assert spec.server is not None
    if spec.server.supervisor == "systemd":
        return Prepared(None, "the systemd unit's own cgroup")
    try:
        for p in (os.path.dirname(path), path):
            with contextlib.suppress(FileExistsError):
                os.mkdir(p, 0o755)
    except OSError as exc:
        return Prepared(None, f"cannot make {exc.filename or path}: {exc.strerror}")
    if not cgroups.trusted(path):
        return Prepared(None, f"{path} exists but is not root's alone (owner or mode): not used")
    return Prepared(path, f"{why}: {path}")


class Entry:
    """An open cgroup.procs: the child writes "0" to it between fork and exec (Popen's preexec_fn), so the
    server and everything it ever starts are members before it runs a line of its own."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def enter(self) -> None:
        os.write(self.fd, b"0")

    def close(self) -> None:
        os.close(self.fd)


def ours(path: str) -> bool:
    """A cgroup of reconcile's own subtree (<cgroup2>/reconcile/<deployment>), not a systemd unit's."""
    root, _ = cgroups.cgroup_root()
    return root is not None and os.path.dirname(path) == os.path.join(root, cgroups.SUBTREE)


def empty_and_remove(path: str, *, budget: float = 5.0) -> None:
    """cgroup.kill (SIGKILL to every member, atomically, forks included), wait until empty, rmdir.
    Only ever our own subtree: a path outside <cgroup2>/reconcile/ is refused."""
    if not ours(path):
        raise ValueError(f"{path} is not a cgroup reconcile made")
    if not os.path.isdir(path):
        return
    if cgroups.cgroup_procs(path):
        with contextlib.suppress(FileNotFoundError), open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    deadline = time.monotonic() + budget
    while cgroups.cgroup_procs(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = cgroups.cgroup_procs(path)
    if left:
        raise RetryableError(
            f"cgroup {path} still holds pid(s) {', '.join(map(str, left))} after cgroup.kill"
        )
    for _ in range(20):  # rmdir answers EBUSY until the last member's exit is fully accounted
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(path)
