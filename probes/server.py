"""What runs for the spec's vLLM deployment: its processes (reconcile.ownership.membership says which are
ours), the pidfile, who listens on the port, the recorded launch identity, the ownership path. Read only.

Called by reconcile.plan.prober. It reads /proc directly: one environ read per process is the whole cost
(about 1-2 ms for 100 processes), and psutil's import alone would be 18 ms.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from probes.common import Absent, Invalid
from reconcile.identity import (
    IDENTITY,
    MARKER,
    pidfile_path,
    redact_argv,
    server_socket,
    serving_spec,
    state_file_path,
)
from reconcile.ownership import cgroups
from reconcile.ownership.membership import (
    Scope,
    deployment_members,
    read_bytes,
    read_pidfile,
    read_stat,
    scope_of,
    server_leader,
    user_name,
)
from reconcile.ownership.sockets import UNSEEN, listeners, one_line
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.display import shown_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    Role = Literal["server", "member", "stray"]

    from reconcile.spec.models import Spec


class DeploymentProcess(Record):
    """A process carrying our marker. `stray`: not in the live server's process group (its leader gone)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    name: str  # comm, cut to 15 characters by the kernel
    cmdline: tuple[str, ...]  # any --api-key value shown as (sensitive)
    create_time: float  # seconds since the epoch
    identity: str | None  # RECONCILE_IDENTITY from its environment
    role: Role


class Pidfile(Record):
    """`ours`: the server reconcile launched; `foreign`: alive but not it (a reused pid); `corrupt`: not
    the decimal pid of an ordinary process (0, 1, a kernel thread, garbage): `reason` says which."""

    path: str
    state: Literal["absent", "unreadable", "corrupt", "dead", "foreign", "ours"]
    pid: int | None = None
    reason: str = ""


class PortListener(Record):
    """Who listens on the spec's port (0: a color's Unix socket): one of our processes, another process, or
    nobody."""

    port: int
    state: Literal["ours", "foreign", "nobody"]
    pid: int | None = None  # None for a foreign listener whose owner cannot be found (another netns)
    name: str | None = None
    user: str | None = None
    cmdline: tuple[str, ...] = ()  # any --api-key value shown as (secret)
    unseen: str = UNSEEN  # why no holder is named (pid None)

    def describe(self) -> str:
        """`pid 123 (user bob: python3 -m http.server 8000)`, for plans and errors."""
        if self.pid is None:
            return self.unseen
        return f"pid {self.pid} (user {self.user or '?'}: {one_line(self.cmdline) or self.name})"


class Ownership(Record):
    """How the deployment's processes are told from others: `cgroup` (members are the processes of
    `where`) or `fallback` (recorded pid + start time + boot id, and the marker); `why` says why."""

    path: Literal["cgroup", "fallback"]
    where: str | None
    why: str


class ServerRecord(Record):
    """What the last start recorded in <state_dir>/server-<name>.json (no secrets in it)."""

    identity: str | None
    components: Mapping[str, str] = MappingProxyType({})
    last_outcome: str | None = None
    last_reason: str | None = None
    ownership: str | None = None  # why the last launch fell back (no cgroup could be made), if it did


class ServerObservation(Record):
    name: str
    processes: tuple[DeploymentProcess, ...]
    pidfile: Pidfile
    listener: PortListener
    record: ServerRecord | Absent | Invalid
    ownership: Ownership = Ownership("fallback", None, "not probed")

    @property
    def server(self) -> DeploymentProcess | None:
        return next((p for p in self.processes if p.role == "server"), None)

    @property
    def strays(self) -> tuple[DeploymentProcess, ...]:
        return tuple(p for p in self.processes if p.role == "stray")

    @property
    def running_identity(self) -> str | None:
        """The identity stamped into the live server's environment (None when no server runs)."""
        server = self.server
        return server.identity if server else None


def _environ(raw: bytes) -> dict[str, str]:
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key in (MARKER.encode(), IDENTITY.encode()):
            out[key.decode()] = value.decode(errors="replace")
    return out


def _boot_time() -> float:
    for line in (read_bytes("/proc/stat") or b"").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return 0.0


def _process(pid: int, env: Mapping[str, str], btime: float, ticks: int) -> DeploymentProcess | None:
    stat = read_stat(pid)
    if stat is None:
        return None
    cmdline = (read_bytes(f"/proc/{pid}/cmdline") or b"").decode(errors="replace").split("\0")
    return DeploymentProcess(
        pid=pid,
        ppid=stat.ppid,
        pgid=stat.pgid,
        sid=stat.sid,
        name=stat.comm,
        cmdline=shown_argv(redact_argv([c for c in cmdline if c])),  # its own title: data, cut
        create_time=btime + stat.start / ticks,
        identity=env.get(IDENTITY),
        role="stray",
    )


def _pidfile(path: str, leader: int | None) -> Pidfile:
    text = read_pidfile(path)
    if text.state != "ok":
        return Pidfile(path, text.state, text.pid, text.reason)
    if text.pid == leader:
        return Pidfile(path, "ours", text.pid)
    alive = read_stat(text.pid or 0) is not None
    return Pidfile(path, "foreign" if alive else "dead", text.pid)


def _listener(host: str, port: int, scope: Scope, ours: set[int], uds: str | None) -> PortListener:
    """Who listens where the server's bind of `host`:`port` would clash (another address's listener on the
    port is not the server's: reconcile.ownership.sockets.reaches); a color's Unix socket (port 0) is ours
    when it is there: only root and the server's user can bind in its directory
    (ownership.sockets.socket_holder_check)."""
    if uds is not None:
        there = os.path.exists(uds)
        return PortListener(0, "ours" if there and ours else "nobody")
    found = listeners(port, first=sorted(ours), host=host)
    if not found:
        return PortListener(port, "nobody")
    bad = next((x for x in found if x.pid not in ours), None)
    x = bad or found[0]
    state: Literal["ours", "foreign"] = "foreign" if bad else "ours"
    user = user_name(x.uid) if x.uid is not None else None
    return PortListener(port, state, x.pid, x.comm if x.pid is not None else None, user, x.cmdline, x.unseen)


def _ownership(spec: Spec, scope: Scope, record: ServerRecord | Absent | Invalid) -> Ownership:
    launched = getattr(record, "ownership", None)
    if launched:  # the last launch could not make or enter its cgroup: its reason
        return Ownership("fallback", None, launched)
    if scope.cgroup is not None:
        return Ownership("cgroup", scope.cgroup, "the server's own cgroup (v2): members are its processes")
    root, why = cgroups.cgroup_root()
    if root is None:
        return Ownership("fallback", None, why)
    return Ownership("cgroup", cgroups.cgroup_path(spec), f"{why}; made at the next start")


def _record(path: str) -> ServerRecord | Absent:
    """The record, through its one reader (reconcile.safety.statefiles): a damaged one is moved aside
    and said in one line, and reads as absent."""
    data = statefiles.read_server_record(path)
    if data is None:
        return Absent(path)
    history = data.get("history") or [{}]
    return ServerRecord(
        identity=data.get("identity"),
        components=dict(data.get("components") or {}),
        last_outcome=history[-1].get("outcome"),
        last_reason=history[-1].get("reason"),
        ownership=history[-1].get("fallback"),
    )


def probe(spec: Spec) -> ServerObservation:
    spec = serving_spec(spec)  # behind [front]: the active color's deployment
    server = spec.server
    if server is None:
        raise ValueError("the spec has no [server]")
    btime, ticks = _boot_time(), os.sysconf("SC_CLK_TCK")
    scope = scope_of(spec)
    found = [
        p
        for pid, raw in deployment_members(scope).items()
        if (p := _process(pid, _environ(raw), btime, ticks)) is not None
    ]
    # Adopted as the server only what reconcile launched (its cgroup, or a recorded launch).
    lead = server_leader(scope, [p.pid for p in found], read_pidfile(pidfile_path(spec)).pid)
    leader = next((p for p in found if p.pid == lead), None)
    processes = []
    for p in sorted(found, key=lambda p: p.pid):
        role: Role = "stray"
        if leader is not None:
            role = "server" if p.pid == leader.pid else "member" if p.pgid == leader.pgid else "stray"
        processes.append(p._replace(role=role))
    record = _record(state_file_path(spec))
    return ServerObservation(
        name=server.name,
        processes=tuple(processes),
        pidfile=_pidfile(pidfile_path(spec), leader.pid if leader else None),
        listener=_listener(server.host, server.port, scope, {p.pid for p in found}, server_socket(spec)),
        record=record,
        ownership=_ownership(spec, scope, record),
    )
