"""The server's pidfile and the record of who it is: which pid is the live server (current_pid), and
writing both when a server is started or adopted. Pidfile and record are 0600 in the 0700 state dir.

Called by actions.server. Membership itself is reconcile.ownership.membership's: a pid here is only ever one
that it proved reconcile launched.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from actions.launching import LaunchCommand, private_dir, write_record
from reconcile.host import atomic_write
from reconcile.identity import pidfile_path
from reconcile.ownership.membership import (
    Scope,
    deployment_members,
    proc_id,
    read_pidfile,
    scope_of,
    server_leader,
    snapshot,
)
from reconcile.safety import statefiles
from reconcile.safety.filesafety import ensure_dir

if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def current_pid(spec: Spec, scope: Scope | None = None) -> int | None:
    """The live server: a process reconcile launched (in the deployment's cgroup, or a recorded launch
    with the same start time and boot), the pidfile's when it is one. Never a bare pid or a marker."""
    scope = scope or scope_of(spec)
    return server_leader(scope, deployment_members(scope), read_pidfile(pidfile_path(spec)).pid)


def write_pidfile(spec: Spec, pid: int) -> None:
    """The pidfile, 0600; a corrupt one (0, 1, a kernel thread, garbage) is kept aside as
    <path>.corrupt-<UTC time> (reconcile.safety.statefiles)."""
    path = pidfile_path(spec)
    if os.path.dirname(path) == spec.machine.state_dir.rstrip("/"):
        private_dir(os.path.dirname(path))
    else:
        ensure_dir(os.path.dirname(path), 0o755)
    text = read_pidfile(path)  # what is not a regular file there, it moved aside
    if text.state == "corrupt":
        statefiles.move_aside_corrupt(path, f"was corrupt ({text.reason})", then="a new one is written")
    atomic_write(path, f"{pid}\n".encode(), mode=0o600)


def remember_members(spec: Spec, pid: int, record: dict[str, Any]) -> None:
    """Record the healthy server's processes (pid, start time, boot id): where no cgroup holds them, this
    is how its children are still known once the server itself is gone (a SIGKILL leaves them)."""
    scope = scope_of(spec)
    if scope.cgroup is not None:
        return
    members = snapshot(deployment_members(scope))
    if record.get("members") != members:
        record["members"] = members
        write_record(spec, record)


def adopt(spec: Spec, command: LaunchCommand, pid: int, record: dict[str, Any]) -> bool:
    """Point the pidfile and the record at `pid` when they do not already (True when rewritten)."""
    text = read_pidfile(pidfile_path(spec))
    launch = proc_id(pid)
    same = text.state == "ok" and text.pid == pid and record.get("pid") == pid
    if same and launch is not None and record.get("launch") == launch.as_json():
        return False
    write_pidfile(spec, pid)
    record.update(identity=command.identity.digest, components=dict(command.identity.components), pid=pid)
    if launch is not None:
        record["launch"] = launch.as_json()
    write_record(spec, record)
    return True
