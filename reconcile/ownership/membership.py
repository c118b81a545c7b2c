"""Which processes are a deployment's, by proof: its own cgroup, or a recorded (pid, start time, boot id),
or the marker; never a process of another user, never a bare pid. Read only.

Used by probes.server and probes.health (who is ours, who listens) and actions.supervising (whom to
signal); reconcile.ownership.cgroups says where the cgroup is, actions.cgroups makes and removes it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from reconcile.identity import MARKER, deployment_id, state_file_path
from reconcile.ownership.cgroups import cgroup_procs, deployment_cgroup
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.display import shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from reconcile.spec.models import Spec

PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread
_BOOT_ID: list[str] = []


class ProcStat(Record):
    """The fields of /proc/PID/stat this module reads; `start` is field 22, in clock ticks since boot."""

    pid: int
    comm: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    start: int


class ProcId(Record):
    """One process, for good: a pid is reused, (pid, start time, boot id) is not."""

    pid: int
    start: int
    boot: str

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start": self.start, "boot": self.boot}


class Scope(Record):
    """What proves membership in deployment `name` (its marker value): the processes in `cgroup`, the
    recorded `launches` (server leaders) and `members` (their children, seen when the server was
    healthy), and the marker; all only for processes whose real and effective uid is `uid`."""

    name: str
    launches: tuple[ProcId, ...] = ()
    members: tuple[ProcId, ...] = ()
    cgroup: str | None = None
    uid: int | None = None  # None: ours (os.geteuid())

    def owner(self) -> int:
        return os.geteuid() if self.uid is None else self.uid


def read_bytes(path: str, limit: int = -1) -> bytes | None:
    """A /proc file's bytes (None when gone or unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_stat(pid: int) -> ProcStat | None:
    """None when the process is gone or a zombie (it holds nothing and cannot be stopped again)."""
    raw = read_bytes(f"/proc/{pid}/stat")
    if raw is None or b")" not in raw:
        return None
    head, _, tail = raw.rpartition(b")")
    f = tail.split()
    if len(f) < 20 or f[0] in (b"Z", b"X"):
        return None
    comm = shown(head.partition(b"(")[2].decode(errors="replace"))  # the process sets it: data, not text
    return ProcStat(pid, comm, int(f[1]), int(f[2]), int(f[3]), int(f[6]), int(f[19]))


def boot_id() -> str:
    if not _BOOT_ID:
        _BOOT_ID.append((read_bytes("/proc/sys/kernel/random/boot_id") or b"").decode().strip())
    return _BOOT_ID[0]


def proc_id(pid: int) -> ProcId | None:
    stat = read_stat(pid)
    return ProcId(pid, stat.start, boot_id()) if stat is not None else None


def is_same(rec: ProcId, stat: ProcStat | None) -> bool:
    """`stat` is the very process `rec` recorded (same boot, same pid, same start time)."""
    return stat is not None and (rec.pid, rec.start, rec.boot) == (stat.pid, stat.start, boot_id())


def proc_ids(data: object) -> tuple[ProcId, ...]:
    """ProcIds from a record's JSON list; entries without all three fields (an old record) are dropped."""
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict):
            pid, start, boot = item.get("pid"), item.get("start"), item.get("boot")
            if isinstance(pid, int) and isinstance(start, int) and isinstance(boot, str) and pid > 1:
                out.append(ProcId(pid, start, boot))
    return tuple(out)


def uids(pid: int) -> tuple[int, int] | None:
    """(real, effective) uid from /proc/PID/status. Not the owner of /proc/PID: a process that makes
    itself non-dumpable has its /proc files owned by root."""
    for line in (read_bytes(f"/proc/{pid}/status") or b"").splitlines():
        if line.startswith(b"Uid:"):
            parts = line.split()
            if len(parts) >= 3:
                return int(parts[1]), int(parts[2])
    return None


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _environ(pid: int) -> bytes | None:
    return read_bytes(f"/proc/{pid}/environ")  # None: gone, a zombie, or not readable


def _overwritten(raw: bytes) -> bool:
    """An environ block that setproctitle overwrote (vLLM's VLLM::EngineCore, VLLM::Worker_TPn): no
    PATH left in it. Every process we launch has PATH."""
    return not any(item.startswith(b"PATH=") for item in raw.split(b"\0"))


def _marked(raw: bytes | None, name: str) -> bool:
    return raw is not None and f"\0{MARKER}={name}\0".encode() in b"\0" + raw


def scope_of(spec: Spec) -> Scope:
    """The deployment's scope: its cgroup (when one exists that only root can fill) and what the server
    record (<state_dir>/server-<name>.json) says our launches were."""
    launches: tuple[ProcId, ...] = ()
    members: tuple[ProcId, ...] = ()
    data = statefiles.read_server_record(state_file_path(spec))  # a damaged one is moved aside
    if data is not None:
        history = data.get("history") or []
        launches = proc_ids([*history[-20:], data.get("launch")])
        members = proc_ids(data.get("members"))
    return Scope(deployment_id(spec), launches, members, deployment_cgroup(spec))


def deployment_members(scope: Scope | str) -> dict[int, bytes]:
    """pid -> its environ bytes for every process of the deployment, ourselves excluded.

    Proven: in the deployment's cgroup; or a recorded launch or member, same start time and boot; or
    carrying the marker. Also a process whose environ setproctitle overwrote, in the session of a
    live, proven session leader. A bare pid (pidfile, session id) proves nothing: a dead leader's
    session id can become another program's. And nothing owned by another uid is ever a member."""
    scope = Scope(scope) if isinstance(scope, str) else scope
    me = os.getpid()
    cg = set(cgroup_procs(scope.cgroup)) if scope.cgroup else set()
    recorded = {r.pid: r for r in (*scope.launches, *scope.members)}
    stats: dict[int, ProcStat] = {}
    envs: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        stat = read_stat(int(entry))
        # Another uid's process is no member, and nothing more of it is read: its environment is as
        # large as its owner likes (~6 MB), and a thousand forks share one copy of it at no cost.
        if stat is None or stat.flags & PF_KTHREAD or not _owned(stat.pid, scope):
            continue
        stats[stat.pid], envs[stat.pid] = stat, _environ(stat.pid) or b""
    proven = {
        pid
        for pid, st in stats.items()
        if pid in cg or _marked(envs[pid], scope.name) or (pid in recorded and is_same(recorded[pid], st))
    }
    leaders = {pid for pid in proven if stats[pid].sid == pid}
    hidden = {
        pid
        for pid, st in stats.items()
        if pid not in proven and st.sid in leaders and _overwritten(envs[pid])
    }
    return {pid: envs[pid] for pid in sorted(proven | hidden)}


def reconcile_processes(specs: Iterable[Spec]) -> set[int]:
    """Every process reconcile itself runs: one in its own cgroup subtree (only root fills it), and each
    member, by proof, of the deployments of `specs` (its cgroup, a recorded launch or member with its
    start time, the marker of our uid; deployment_members). Never a process named only by what it
    says of itself (its command line, cwd or executable): any user can say anything there."""
    from reconcile.ownership.cgroups import subtree_procs

    out = subtree_procs()
    for spec in specs:
        if spec.server is not None:
            out.update(deployment_members(scope_of(spec)))
    return out


def _owned(pid: int, scope: Scope) -> bool:
    return uids(pid) == (scope.owner(), scope.owner())


def _proven(pid: int, scope: Scope, stat: ProcStat, raw: bytes | None) -> bool:
    """A process of the deployment's uid (the caller checked) proven by 1-3 of deployment_members."""
    if scope.cgroup and pid in cgroup_procs(scope.cgroup):
        return True
    if _marked(raw, scope.name):
        return True
    return any(r.pid == pid and is_same(r, stat) for r in (*scope.launches, *scope.members))


def is_member(pid: int, scope: Scope | str) -> bool:
    """The same rule for one process (checked again, after pinning it, right before a signal)."""
    scope = Scope(scope) if isinstance(scope, str) else scope
    stat = read_stat(pid)
    if stat is None or stat.flags & PF_KTHREAD or not _owned(pid, scope):
        return False
    raw = _environ(pid)  # read only once its uid is the deployment's (deployment_members says why)
    if _proven(pid, scope, stat, raw):
        return True
    if raw is None or not _overwritten(raw) or stat.sid == pid:
        return False
    leader = read_stat(stat.sid)
    return (
        leader is not None
        and _owned(stat.sid, scope)
        and _proven(stat.sid, scope, leader, _environ(stat.sid))
    )


def launched_by_us(pid: int, scope: Scope) -> bool:
    """Whether `pid` is a server reconcile itself started: a session leader in the deployment's cgroup,
    or a recorded launch (same start time and boot). The marker and the digest are not enough: any
    user can copy them from a process listing. Only such a process is ever adopted as the server."""
    stat = read_stat(pid)
    if stat is None or stat.sid != pid or not _owned(pid, scope):
        return False
    if scope.cgroup and pid in cgroup_procs(scope.cgroup):
        return True
    return any(is_same(r, stat) for r in scope.launches if r.pid == pid)


def server_leader(scope: Scope, members: Iterable[int], pidfile_pid: int | None) -> int | None:
    """The live server among `members`: a process reconcile launched (launched_by_us), the pidfile's
    when it is one, else the newest."""
    leaders = [
        (stat.start, pid) for pid in members if launched_by_us(pid, scope) and (stat := read_stat(pid))
    ]
    if any(pid == pidfile_pid for _, pid in leaders):
        return pidfile_pid
    return max(leaders)[1] if leaders else None


def snapshot(pids: Iterable[int]) -> list[dict[str, object]]:
    """ProcIds of `pids` as the record keeps them (the gone ones left out)."""
    return [p.as_json() for pid in sorted(pids) if (p := proc_id(pid)) is not None]


class PidfileText(Record):
    """What a pidfile holds. `corrupt`: anything but the decimal pid of an ordinary process."""

    state: Literal["absent", "unreadable", "corrupt", "ok"]
    pid: int | None = None
    reason: str = ""


def read_pidfile(path: str) -> PidfileText:
    try:
        raw = statefiles.read_pidfile(path)  # not a regular file: moved aside, and absent
    except OSError as exc:
        return PidfileText("unreadable", reason=f"cannot read it ({exc.strerror})")
    if raw is None:
        return PidfileText("absent")
    text = raw.strip()
    if not re.fullmatch(rb"[0-9]{1,10}", text):
        return PidfileText("corrupt", reason=f"holds {raw[:24]!r}, not a process id")
    pid = int(text)
    if pid <= 1:
        return PidfileText("corrupt", pid, f"holds {pid}, which is {'no process' if pid == 0 else 'init'}")
    stat = read_stat(pid)
    if stat is not None and stat.flags & PF_KTHREAD:
        return PidfileText("corrupt", pid, f"holds {pid}, a kernel thread ({stat.comm})")
    return PidfileText("ok", pid)


def front_master(spec: Spec) -> int | None:
    """The pid of the deployment's HAProxy master: named by its pidfile, run by root from [front]
    haproxy, with our config on its command line (a pid alone is never trusted)."""
    from reconcile.identity import front_paths
    from reconcile.safety import statefiles

    front = getattr(spec, "front", None)
    assert front is not None
    config, pidfile, _sock = front_paths(spec)
    try:
        raw = statefiles.read_state(pidfile, max_bytes=64)
        pid = int(raw.split()[0]) if raw else 0
    except (OSError, ValueError, IndexError):
        return None
    status = read_bytes(f"/proc/{pid}/status") if pid > 0 else None
    argv = (read_bytes(f"/proc/{pid}/cmdline") or b"").split(b"\0")
    uid = next((ln.split()[1:2] for ln in (status or b"").splitlines() if ln.startswith(b"Uid:")), [])
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    ours = uid == [b"0"] and exe == os.path.realpath(front.haproxy) and config.encode() in argv
    return pid if ours else None


def former_front(spec: Spec) -> Spec | None:
    """A spec without [front] whose deployment our HAProxy still serves ([front] was taken out, or a
    rollback goes to a generation from before it): the spec as it was behind that front (apt's haproxy,
    the default color ports), to stop it by; None when no HAProxy of ours serves the deployment. Ours:
    the master its pidfile in the state dir names, run by root from apt's haproxy with our config on its
    command line (reconcile.ownership.membership.front_master): the deployment's own
    <state_dir>/front-<name>.cfg, or for a deployment of [deployments] the machine's
    <machine state_dir>/front.cfg while that still has the deployment's frontend."""
    if spec.server is None or getattr(spec, "front", None) is not None:
        return None
    from reconcile.identity import as_fronted, machine_dir, serves_in

    was = as_fronted(spec)
    if front_master(was) is not None:
        return was
    machine = machine_dir(spec)
    if machine is None:
        return None
    was = as_fronted(spec, machine)
    return was if front_master(was) is not None and serves_in(was) else None
