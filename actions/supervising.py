"""A deployment's processes, as actions.server handles them: find its members, stop, confirm GPU release.

Only members (reconcile.ownership.membership: the deployment's cgroup, a recorded launch with the same start
time and boot, the marker; never another user's process) are ever signalled, each pinned by a pidfd
and checked again first; anything else is left alone whatever its name, command line or port.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TextIO

from reconcile.errors import RetryableError
from reconcile.ownership.membership import Scope, deployment_members, is_member
from reconcile.record import Record


def environ_value(pid: int, key: str) -> str | None:
    """One variable of a process's environment (None when unset or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    prefix = key.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def marked_pids(scope: Scope | str, *, spare_pgid: int | None = None) -> list[int]:
    """Live members of the deployment (ourselves excluded), by pid; a bare name means the marker only
    (reconcile.ownership.membership.deployment_members says why)."""
    out = []
    for pid in deployment_members(scope):
        if spare_pgid is None or _pgid(pid) != spare_pgid:
            out.append(pid)
    return sorted(out)


class Pinned:
    """A process of ours pinned by a pidfd: signals reach it and no other, even if its pid is reused.
    Used for the deployment's members here, and for the front's HAProxy master (actions.haproxy)."""

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid, self.fd = pid, fd

    @classmethod
    def pin(cls, pid: int, proven: Callable[[int], bool]) -> Pinned | None:
        """`pid` pinned, when `proven(pid)` holds once it is pinned (so the proof is of the process
        the pidfd holds); None when it is gone or not proven."""
        try:
            fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except (OSError, AttributeError):  # a kernel before 5.3: fall back to the pid
            fd = None
        if proven(pid):  # checked after pinning
            return cls(pid, fd)
        if fd is not None:
            os.close(fd)
        return None

    @classmethod
    def take(cls, pid: int, scope: Scope | str) -> Pinned | None:
        """A member of the deployment `scope`, pinned (reconcile.ownership.membership.is_member)."""
        return cls.pin(pid, lambda p: is_member(p, scope))

    def send(self, sig: int) -> bool:
        """`sig`; after SIGTERM a SIGCONT too, as systemd sends: a stopped process (a hung engine's
        SIGSTOPped EngineCore) would otherwise hold the SIGTERM until the SIGKILL."""
        try:
            for one in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
                if self.fd is not None:
                    signal.pidfd_send_signal(self.fd, one)
                else:
                    os.kill(self.pid, one)
            return True
        except ProcessLookupError:
            return False

    def exited(self) -> bool:
        """Gone for good: past exit_files (locks, sockets and device memory released), not merely
        unreadable, which an exiting process already is while it still holds them."""
        if self.fd is None:
            return not is_alive(self.pid)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def signal_marked(pid: int, scope: Scope | str, sig: int) -> bool:
    """Send `sig` to `pid` only if it is ours (checked after pinning it with a pidfd)."""
    held = Pinned.take(pid, scope)
    if held is None:
        return False
    try:
        return held.send(sig)
    finally:
        held.close()


class StopOutcome(Record):
    """Who got SIGTERM, who still needed SIGKILL, and what NVML said afterwards."""

    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    gpu: str

    def describe(self) -> str:
        if not self.terminated:
            return "no process of the deployment ran"
        text = f"stopped {len(self.terminated)} process(es) ({', '.join(map(str, self.terminated))})"
        if self.killed:
            text += f"; SIGKILL needed for {', '.join(map(str, self.killed))}"
        return f"{text}; {self.gpu}" if self.gpu else text


def stop_marked(
    scope: Scope | str,
    *,
    timeout: float,
    spare_pgid: int | None = None,
    gpu_budget: float = 10.0,
    leader: int | None = None,
) -> StopOutcome:
    """SIGTERM every member (the server's group and any stray), wait up to `timeout`, SIGKILL what is
    left, then confirm with NVML that none of them holds GPU memory. A whole stop (no `spare_pgid`)
    ends with the deployment's cgroup emptied by cgroup.kill and removed.

    Each member is signalled on its own rather than by killpg: a group signal would also reach a
    process of that group that is not a member. `leader` (the API server's pid) gets SIGTERM alone
    first and the time to exit by itself: vLLM drains its in-flight requests (`--shutdown-timeout`) and
    then stops its own engine; a SIGTERM to the EngineCore at the same moment would cut them.
    """
    name = scope if isinstance(scope, str) else scope.name
    held: dict[int, Pinned] = {}

    def sweep(sig: int) -> None:  # catches children spawned while we wait, too
        for pid in marked_pids(scope, spare_pgid=spare_pgid):
            if pid not in held and (h := Pinned.take(pid, scope)) is not None:
                held[pid] = h
                h.send(sig)

    def running() -> list[int]:
        return [pid for pid, h in held.items() if not h.exited()]

    try:
        deadline = time.monotonic() + timeout
        members = set(marked_pids(scope, spare_pgid=spare_pgid)) if leader is not None else set()
        if leader in members:
            first = Pinned.take(leader, scope)
            if first is not None:
                held[leader] = first
                first.send(signal.SIGTERM)
                while not first.exited() and time.monotonic() < deadline:
                    time.sleep(0.05)
        sweep(signal.SIGTERM)
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
            sweep(signal.SIGTERM)
        termed = list(held)
        killed = [pid for pid in running() if held[pid].send(signal.SIGKILL)]
        sweep(signal.SIGKILL)
        end = time.monotonic() + 5.0
        while running() and time.monotonic() < end:
            time.sleep(0.05)
        left = running()
    finally:
        for h in held.values():
            h.close()
    if left:
        raise RetryableError(f"deployment {name}: pid(s) {', '.join(map(str, left))} survived SIGKILL")
    if spare_pgid is None and not isinstance(scope, str) and scope.cgroup is not None:
        from actions.cgroups import empty_and_remove, ours

        if ours(scope.cgroup):
            empty_and_remove(scope.cgroup)
    killed += [pid for pid in held if pid not in termed]
    ended = [*held, *sorted(members - set(held))]  # with a leader: its children it stopped itself, too
    gpu = confirm_gpu_released(ended, budget=gpu_budget) if ended else ""
    return StopOutcome(tuple(ended), tuple(killed), gpu)


def confirm_gpu_released(pids: list[int], *, budget: float = 10.0) -> str:
    """Wait (bounded) until NVML lists none of `pids` on any GPU; without NVML say it was not checked."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU: all mean "cannot confirm"
        return f"GPU release not confirmed (NVML unavailable: {exc})"
    import tenacity

    wanted = set(pids)

    @tenacity.retry(
        stop=tenacity.stop_after_delay(budget),
        wait=tenacity.wait_fixed(0.25),
        retry=tenacity.retry_if_exception_type(RetryableError),
        reraise=True,
    )
    def check() -> None:
        holders = sorted(
            {
                p.pid
                for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
                if p.pid in wanted
            }
        )
        if holders:
            raise RetryableError(
                f"pid(s) {', '.join(map(str, holders))} still hold GPU memory {budget:g}s after the stop"
            )

    try:
        check()
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return "NVML: none of them holds GPU memory"


def process_age(pid: int) -> float:
    """Seconds since `pid` started (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def is_alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits for its parent to read its status)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class ReadinessProgress(Record):
    """One tick of the wait for /health: seconds so far and the log's last line."""

    elapsed: float
    last_line: str
    lines: tuple[str, ...] = ()  # the log's last lines since the start (vLLM's phases are read from them)


ProgressFn = Callable[[ReadinessProgress], None]


def tty_progress(stream: TextIO) -> ProgressFn | None:
    """A live one-line progress on a terminal (None when `stream` is not one)."""
    if not stream.isatty():
        return None
    import shutil

    def render(p: ReadinessProgress) -> None:
        width = shutil.get_terminal_size().columns - 1
        text = f"  waiting for /health  {p.elapsed:5.0f}s  {p.last_line}"
        stream.write("\r" + text[:width].ljust(width))
        stream.flush()

    return render


def line_progress(emit: Callable[[str], None], every: float = 15.0) -> ProgressFn:
    """Progress as plain lines, at most one per `every` seconds (logs, timers, a non-TTY CLI)."""
    last = [-every]

    def render(p: ReadinessProgress) -> None:
        if p.elapsed - last[0] >= every:
            last[0] = p.elapsed
            emit(f"waiting for /health: {p.elapsed:.0f}s; log: {p.last_line[:160]}")

    return render
