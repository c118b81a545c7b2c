"""`reconcile pause` / `resume`: a file under `machine.state_dir` that holds off scheduled applies.

Written by the CLI; read by the executor (a `--scheduled` apply only plans while it exists), the
planner (a note) and the reports. It says who paused (user, pid, tty or ssh client), when and why.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping

from reconcile.errors import ReconcileError
from reconcile.host import atomic_write
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir
from reconcile.safety.shapes import TIME_MAX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PAUSE_FILE = "paused.json"


class Pause(Record):
    reason: str
    user: str
    pid: int
    since: float  # seconds since the epoch
    until: float | None = None  # None: until `reconcile resume`
    tty: str | None = None
    ssh_client: str | None = None  # the client address of $SSH_CONNECTION, when paused over ssh

    def expired(self, now: float | None = None) -> bool:
        return self.until is not None and (now if now is not None else time.time()) >= self.until

    def who(self) -> str:
        where = [w for w in (self.tty, f"ssh from {self.ssh_client}" if self.ssh_client else None) if w]
        return f"{self.user} (pid {self.pid}{', ' + ', '.join(where) if where else ''})"

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.since))
        until = (
            f", until {time.strftime('%Y-%m-%d %H:%M:%S %z', time.localtime(self.until))}"
            if self.until is not None
            else ""
        )
        return f"paused by {self.who()} since {since}{until}: {self.reason}"

    def as_data(self) -> dict[str, Any]:
        return dict(self._asdict())


def pause_path(state_dir: str) -> str:
    return os.path.join(state_dir, PAUSE_FILE)


def _user(env: Mapping[str, str]) -> str:
    # sudo keeps the person's name in SUDO_USER; root's own name says nothing about who it was.
    for key in ("SUDO_USER", "LOGNAME", "USER"):
        if env.get(key):
            return env[key]
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _tty() -> str | None:
    for fd in (0, 1, 2):
        try:
            return os.ttyname(fd)
        except OSError:
            continue
    return None


def who_am_i(env: Mapping[str, str] | None = None) -> tuple[str, str | None, str | None]:
    """(user, tty, ssh client address) of the calling process."""
    env = os.environ if env is None else env
    ssh = (env.get("SSH_CONNECTION") or env.get("SSH_CLIENT") or "").split()
    return _user(env), _tty() or env.get("SSH_TTY") or None, ssh[0] if ssh else None


def pause(
    state_dir: str, reason: str, *, duration: float | None = None, env: Mapping[str, str] | None = None
) -> tuple[Pause, Pause | None]:
    """Write the pause file; returns (the new pause, the one it replaced)."""
    if not reason.strip():
        raise ReconcileError("--reason is empty: say why, for the next person who finds the box paused")
    previous = read_pause(state_dir)
    user, tty, ssh = who_am_i(env)
    now = time.time()
    new = Pause(reason.strip(), user, os.getpid(), now, now + duration if duration else None, tty, ssh)
    if new.until is not None and new.until > TIME_MAX:
        raise ReconcileError(
            f"--for: a pause of {duration:g} s would end after 9999-12-31: give a shorter one"
        )
    ensure_dir(state_dir, PRIVATE_DIR)
    _write(pause_path(state_dir), new)
    return new, previous


def _write(path: str, pause: Pause) -> None:
    """Written only when its reader (statefiles.read_pause) reads it back: a pause whose reason is past
    its bound would otherwise be moved aside at the next read, its reason and end lost."""
    raw = (json.dumps(pause.as_data(), indent=2) + "\n").encode()
    why = statefiles.unreadable(raw, max_bytes=statefiles.PAUSE_MAX, shape=statefiles.PAUSE)
    if why is not None:
        raise ReconcileError(f"{path}: not written: it {why}; give a shorter --reason")
    atomic_write(path, raw, mode=PRIVATE_FILE)


def resume(state_dir: str) -> Pause | None:
    """Remove the pause file; returns the pause it held (None when nothing was paused)."""
    held = read_pause(state_dir, include_expired=True)
    try:
        os.unlink(pause_path(state_dir))
    except FileNotFoundError:
        return None
    return held


def read_pause(state_dir: str, *, include_expired: bool = False) -> Pause | None:
    """The pause in force, or None. A damaged pause file still pauses, holding off being the safe side:
    it is moved aside (reconcile.safety.statefiles) and a pause saying so takes its place, until
    `reconcile resume`."""
    path = pause_path(state_dir)
    if os.path.lexists(state_dir) and not os.path.isdir(state_dir):
        raise ReconcileError(
            f"{state_dir}: [machine].state_dir is not a directory (a file is there): move the file "
            "away, or set state_dir to a directory of reconcile's own"
        )
    data, aside = statefiles.read_pause(path)
    if aside is not None:
        reason = f"{PAUSE_FILE} was damaged (kept as {aside}); held off until `reconcile resume`"
        found = Pause(reason, "reconcile", os.getpid(), time.time())
        with contextlib.suppress(OSError):
            _write(path, found)
        return found
    if data is None:
        return None
    found = Pause(
        reason=data["reason"],
        user=data["user"],
        pid=data["pid"],
        since=float(data["since"]),
        until=None if data.get("until") is None else float(data["until"]),
        tty=data.get("tty"),
        ssh_client=data.get("ssh_client"),
    )
    if found.expired() and not include_expired:
        return None
    return found


def pause_notes(state_dir: str) -> list[str]:
    """One line for a plan's notes when scheduled applies are held off."""
    held = read_pause(state_dir)
    if held is None:
        return []
    return [f"scheduled applies are {held.describe()} (`reconcile resume` ends it)"]
