"""Damaged state never wedges a run (issue 24, class 6): every state file reconcile reads under
`[machine] state_dir` (and the pidfile) is damaged for real -- a FIFO, a directory, a symlink to a
root-only file, bytes that are not JSON, the wrong top-level type, a field of the wrong type, a huge
file -- and `reconcile plan --scheduled`, `reconcile apply`, `reconcile history` and a last `plan`
are run on the demo spec. Each must finish within a bound, with its normal exit code, name the file
in one line, leave the file aside as `<name>.corrupt-<time>` and (where the run writes one) write a
fresh, valid file in its place.

Who does the damage: not a local user. The state dir is root's 0700, so nobody else can plant these;
crashes, disk errors, older versions and hand edits do. So these tests run as the caller (root in
CI), not as nobody.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.apply_support import Demo, Run

BOUND = 60.0  # seconds a run may take; a FIFO opened for reading without O_NONBLOCK waits forever
SECRET = "root-only-secret-7f3a9c\n"


@dataclass(frozen=True)
class Kind:
    """One state file: where it is, the damage of a wrong field's type, what a run does with it."""

    where: Callable[[Demo], Path]
    wrong_field: bytes
    rewritten: bool = True  # a run writes a fresh one after moving the damaged one aside
    kept: tuple[str, ...] = ()  # damages left in place (the lock's text; a record's: skipped)
    provoke: bool = False  # read or written only when apply changes something: delete the key first
    before: Callable[[Demo], None] | None = None  # what else the case needs (an older state dir)


def _server_record(d: Demo) -> Path:
    return d.state_dir / f"server-{d.name}.json"


KINDS = {
    "last-run": Kind(
        lambda d: d.last_run,
        json.dumps({"format": "reconcile-last-run/1", "last_success_timestamp": "yesterday"}).encode(),
    ),
    "conditions": Kind(
        lambda d: d.state_dir / "conditions.json",
        json.dumps({"server": {"status": "ok", "since": None}}).encode(),
    ),
    "paused": Kind(
        lambda d: d.state_dir / "paused.json",
        json.dumps({"reason": "x", "user": "u", "pid": 1, "since": "soon"}).encode(),
    ),
    # A regular apply.lock may be flock()ed by a live apply: only a non-file there is moved aside.
    "apply-lock": Kind(
        lambda d: d.lock_file,
        json.dumps({"pid": "x", "started": "y", "command": 3}).encode(),
        kept=("not-json", "wrong-top-type", "wrong-field-type", "huge"),
    ),
    "generations-index": Kind(
        lambda d: d.state_dir / "generations" / "index.json",
        json.dumps({"format": "reconcile-generations/1", "records": ["1"]}).encode(),
        provoke=True,
    ),
    # Records are read by apply only when there is no index yet (an older reconcile's state dir):
    # the first index adopts the records only root could have written. Their content is judged
    # when used (rollback, diff); what is not a file, or too large to be one, is moved aside.
    "generations-record": Kind(
        lambda d: d.state_dir / "generations" / "1.json",
        json.dumps({"changes": 5, "generation": "1"}).encode(),
        rewritten=False,
        kept=("not-json", "wrong-top-type", "wrong-field-type"),
        provoke=True,
        before=lambda d: (d.state_dir / "generations" / "index.json").unlink(),
    ),
    "profile-index": Kind(
        lambda d: d.state_dir / "profile" / "index.json",
        json.dumps({"records": {"1": 7}, "current": "1", "hold": {"generation": "one"}}).encode(),
    ),
    # A record whose bytes fail the index's hash is listed as skipped by history, not moved (one
    # larger than any record is moved aside, as anything that is not a file reconcile wrote).
    "profile-record": Kind(
        lambda d: d.state_dir / "profile" / "1.json",
        json.dumps({"generation": "1", "created": "x", "verdict": 3}).encode(),
        rewritten=False,
        kept=("not-json", "wrong-top-type", "wrong-field-type"),
    ),
    "server-record": Kind(
        _server_record,
        json.dumps({"history": [{"outcome": "failed", "at": "yesterday"}], "members": "x"}).encode(),
        provoke=True,  # a converged apply starts nothing: a restart writes the record
    ),
    "pidfile": Kind(lambda d: d.pidfile, b"-5\n"),
}

DAMAGES = ("fifo", "directory", "symlink", "not-json", "wrong-top-type", "wrong-field-type", "huge")


def damage(path: Path, how: str, kind: Kind, secret: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "directory":
        path.mkdir(0o700)
        (path / "inside").write_text("x")
    elif how == "symlink":
        path.symlink_to(secret)
    elif how == "not-json":
        path.write_bytes(b"\x00\xff{not json")
    elif how == "wrong-top-type":
        path.write_bytes(b"[1, 2, 3]\n")
    elif how == "wrong-field-type":
        path.write_bytes(kind.wrong_field)
    elif how == "huge":
        with open(path, "wb") as f:
            f.write(b'{"format": "')
            f.truncate(256 << 20)  # sparse: 256 MiB that a bounded reader never reads


def converged(demo: Demo) -> None:
    first = demo.cli("apply", timeout=180)
    assert first.returncode in (0, 2), first.output
    again = demo.cli("plan", timeout=BOUND)
    assert again.returncode == 0, again.output


def aside_of(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.corrupt-"))


def lines_naming(runs: list[Run], path: Path) -> list[str]:
    """Lines that say the file was moved aside (or, for a record, skipped)."""
    out = []
    for run in runs:
        for line in run.output.splitlines():
            if str(path) in line and ("moved aside" in line or "skipped" in line):
                out.append(line)
    return out


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", list(KINDS))
def test_a_damaged_state_file_is_moved_aside_and_the_runs_go_on(
    seeded: Demo, tmp_path: Path, name: str, how: str
) -> None:
    demo, kind = seeded, KINDS[name]
    secret = tmp_path / "shadow"  # like /etc/shadow: root's, 0600
    secret.write_text(SECRET)
    secret.chmod(0o600)
    converged(demo)
    path = kind.where(demo)
    if kind.provoke:
        demo.key_file.unlink()
    if kind.before is not None:
        kind.before(demo)
    damage(path, how, kind, secret)

    runs = [
        demo.cli("plan", "--scheduled", timeout=BOUND),
        demo.cli("apply", timeout=BOUND),
        demo.cli("history", timeout=BOUND),
    ]
    final = demo.cli("plan", timeout=BOUND)

    everything = "\n".join(r.output for r in [*runs, final])
    assert "internal error" not in everything and "Traceback" not in everything, everything
    assert SECRET.strip() not in everything
    assert secret.read_text() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert runs[0].returncode in (0, 2), runs[0].output
    assert runs[1].returncode in (0, 2), runs[1].output
    assert runs[2].returncode == 0, runs[2].output
    assert final.returncode == 0, final.output  # converged: nothing left wedged

    kept = how in kind.kept
    named = lines_naming([*runs, final], path)
    aside = aside_of(path)
    if kept:
        assert aside == []
        if name == "profile-record":
            assert len([ln for ln in named if "skipped" in ln]) == 1, everything
    else:
        assert len(named) == 1, everything
        assert "moved aside" in named[0] and str(aside[0]) in named[0], named
        assert len(aside) == 1, aside
        st = os.lstat(aside[0])
        want = {"fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR, "symlink": stat.S_ISLNK}.get(
            how, stat.S_ISREG
        )
        assert want(st.st_mode), aside  # the very thing that was there, renamed, never followed
        if how == "symlink":
            assert os.readlink(aside[0]) == str(secret)
    if kind.rewritten:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, path
        if path.suffix == ".json" and name != "apply-lock":
            assert isinstance(json.loads(path.read_text()), dict)
        elif name == "pidfile":
            assert path.read_text().strip().isdigit()


def test_a_textfile_that_is_a_fifo_is_moved_aside_and_the_report_written(tmp_path: Path) -> None:
    """The Prometheus textfile is read back for its counters when no last-run.json is known."""
    spec = tmp_path / "box.toml"
    spec.write_text(f'[machine]\nstate_dir = "{tmp_path / "state"}"\n')
    textfile = tmp_path / "metrics" / "reconcile.prom"
    textfile.parent.mkdir()
    os.mkfifo(textfile)
    argv = [sys.executable, "-m", "reconcile", "plan", "--textfile", str(textfile), "--spec", str(spec)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, env=_env(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "internal error" not in out, out
    assert len([ln for ln in out.splitlines() if str(textfile) in ln and "moved aside" in ln]) == 1, out
    assert stat.S_ISFIFO(os.lstat(aside_of(textfile)[0]).st_mode)
    assert "reconcile_runs_total" in textfile.read_text()


def test_a_fifo_in_the_private_cache_is_a_miss_not_a_hang(tmp_path: Path) -> None:
    """The per-user caches (spec, preflight memo, git answers) are not state: a damaged entry is a
    miss, and rewritten by rename where the name allows."""
    spec = tmp_path / "box.toml"
    spec.write_text(f'[machine]\nstate_dir = "{tmp_path / "state"}"\n')
    argv = [sys.executable, "-m", "reconcile", "plan", "--spec", str(spec)]
    assert subprocess.run(argv, capture_output=True, timeout=BOUND, env=_env(tmp_path)).returncode == 0
    entries = [p for p in (tmp_path / "cache" / "reconcile").rglob("*") if p.is_file()]
    assert entries
    for entry in entries:
        entry.unlink()
        os.mkfifo(entry, 0o600)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.parametrize("what", ["socket", "character device"])
def test_a_socket_or_device_at_a_state_name_is_never_opened_and_is_moved_aside(
    tmp_path: Path, what: str
) -> None:
    """A device node is judged by lstat before any open (/dev/zero would never end; a tape rewinds)."""
    import socket

    from reconcile.safety import statefiles

    path = tmp_path / "last-run.json"
    if what == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    with pytest.raises(statefiles.NotAFile, match=f"was a {what}"):
        statefiles.read_state(str(path), max_bytes=1024)
    statefiles.take_notes()
    assert statefiles.read_last_run(str(path)) is None
    (line,) = statefiles.take_notes()
    assert line.startswith(f"state: {path} was a {what}: moved aside to {path}.corrupt-"), line
    assert not os.path.lexists(path) and len(aside_of(path)) == 1
