"""The apply lock under `machine.state_dir`, and the sweep of the temp files a killed apply left.
Called by the executor (lock, sweep) and the CLI; the apply journal is reconcile.apply.journal's,
the generations reconcile.apply.generations'.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Collection, Iterator

from reconcile.errors import ReconcileError
from reconcile.host import remove_stale_temps
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir, open_nofollow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


class LockTimeout(ReconcileError):
    """Another apply holds the lock for longer than --lock-timeout."""


class LockHolder(Record):
    pid: int
    started: float
    command: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} since {when} ({self.command})"


def _read_holder(fd: int) -> LockHolder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = statefiles.parse_lock_holder(os.read(fd, 4096))
    return None if data is None else LockHolder(data["pid"], float(data["started"]), data["command"])


class HeldLock(Record):
    path: str
    fd: int
    took_over: LockHolder | None  # a holder that died without releasing (reported by the CLI)


@contextlib.contextmanager
def apply_lock(
    state_dir: str,
    *,
    timeout: float,
    command: str | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[HeldLock]:
    """An exclusive flock on `<state_dir>/apply.lock` holding the holder's pid, start and command.

    flock is released by the kernel when its holder dies, so a dead holder never blocks us; its
    record is still in the file (a clean release empties it), which is how we know we took over
    from it. `on_wait` is told once, with the holder, when we have to wait.
    """
    ensure_dir(state_dir, PRIVATE_DIR)
    path = os.path.join(state_dir, "apply.lock")
    # A FIFO, a directory or a symlink at the name cannot be a live lock (an apply flocks a regular
    # file it made): it is moved aside and the lock taken afresh.
    statefiles.clear_non_file(path, then="the lock is taken afresh")
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, PRIVATE_FILE)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # put there since we looked
        os.close(fd)
        raise ReconcileError(f"{path} is not a regular file: move it aside and re-run")
    if st.st_mode & 0o077:
        os.fchmod(fd, PRIVATE_FILE)  # made by an older reconcile
    start = time.monotonic()
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_holder(fd)
                who = holder.describe() if holder else "another process"
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise LockTimeout(
                        f"{path}: another apply holds the lock: {who}; waited {timeout:g}s "
                        "(raise --lock-timeout, or wait for it to finish)"
                    ) from None
                # A holder writes its record just after taking the lock: give it a moment to appear.
                if on_wait is not None and not told and (holder is not None or waited > 1.0):
                    on_wait(who)
                    told = True
                time.sleep(0.05)
        # A record left in the file is a holder that never released: it was killed (a clean release
        # empties the file). Its pid may be alive again by now as another process: it is still gone.
        previous = _read_holder(fd)
        took_over = previous if previous is not None and previous.pid != os.getpid() else None
        me = {"pid": os.getpid(), "started": time.time(), "command": command or " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
        try:
            yield HeldLock(path, fd, took_over)
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# --- leftovers of a killed apply ------------------------------------------------------------


def sweep_stale_temps(spec: Spec) -> list[str]:
    """Remove the temp files that an apply killed between write and rename left beside the files it
    writes (the key's may hold a whole key). Only under the apply lock.

    No tree is walked: the state dir and its generations/ (any of reconcile's temp names: only reconcile
    writes there), and beside the model's config.json, its backup and its record, the key file and the
    pidfile (the temps of those very files). Only reconcile's own temp names, of a writer that is gone
    (host.remove_stale_temps). Returns the paths removed.
    """
    from reconcile.apply.journal import generations_dir
    from reconcile.identity import pidfile_path

    places: list[tuple[str, Collection[str] | None]] = [
        (spec.machine.state_dir, None),
        (generations_dir(spec.machine.state_dir), None),
    ]
    if spec.model is not None:
        places.append((spec.model.dir, (".reconcile-model.json", "config.json", "config.json.bak")))
    if spec.api_key is not None:
        places.append((os.path.dirname(spec.api_key.file), (os.path.basename(spec.api_key.file),)))
    if spec.server is not None:
        pidfile = pidfile_path(spec)
        places.append((os.path.dirname(pidfile), (os.path.basename(pidfile),)))
    removed = [path for directory, names in places for path in remove_stale_temps(directory, names)]
    return sorted(set(removed))
