"""Issue 13, item 5: paths root writes or trusts, attacked the way a hostile local user would.

In a directory another user owns: a symlinked log, a planted API key, a planted generation record;
under umask 000 and 077: the modes of the venv, the model dir, the log and the state. Each test
runs the real CLI against a copy of the CPU demo (tests/apply_support.py) and checks the machine.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconcile.safety.filesafety import UnsafePath, ensure_dir, open_append, parent_problem, umask
from reconcile.spec.loader import load_spec
from tests.apply_support import Demo, Run

NOBODY = 65534


def nobodys_dir(path: Path) -> Path:
    """A directory another user (nobody) owns: they may put anything in it."""
    path.mkdir(parents=True)
    os.chown(path, NOBODY, NOBODY)
    return path


def set_server(key: str, value: Any) -> Any:
    def edit(doc: Any) -> None:
        doc["server"][key] = value

    return edit


def test_a_symlinked_log_in_another_users_dir_is_refused_and_not_followed(seeded: Demo) -> None:
    victim = seeded.root / "root-only.conf"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    log = nobodys_dir(seeded.root / "theirs") / "demo.log"
    log.symlink_to(victim)
    os.lchown(log, NOBODY, NOBODY)
    seeded.write_spec(set_server("log", str(log)))

    plan = seeded.cli("plan")
    assert plan.returncode == 1, plan.output
    assert f"[server].log {log}: {log.parent} is owned by nobody (uid {NOBODY})" in plan.output
    run = seeded.cli("apply")
    assert run.returncode == 1, run.output
    assert victim.read_text() == "root's own\n"  # old code: root appended "--- reconcile ... starting"
    assert not seeded.server_pids()


def test_a_state_dir_in_another_users_dir_gets_nothing_written(tmp_path: Path) -> None:
    theirs = nobodys_dir(tmp_path / "theirs")
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[machine]\nstate_dir = "{theirs}/state"\n')
    for args in (("plan",), ("apply",), ("pause", "--reason", "x")):
        proc = subprocess.run(
            [sys.executable, "-m", "reconcile", *args, "--spec", str(spec)], capture_output=True, text=True
        )
        assert proc.returncode == 1, (args, proc.stdout + proc.stderr)
        assert f"{theirs} is owned by nobody" in proc.stdout + proc.stderr, args
    assert list(theirs.iterdir()) == []  # old code: state/apply.lock, last-run.json, paused.json


def test_a_symlinked_log_in_our_own_dir_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x\n")
    (tmp_path / "demo.log").symlink_to(victim)
    with pytest.raises(UnsafePath, match="is a symlink"):
        open_append(str(tmp_path / "demo.log"))
    assert victim.read_text() == "x\n"


def test_a_planted_world_readable_key_in_another_users_dir_is_not_adopted(seeded: Demo) -> None:
    key = nobodys_dir(seeded.root / "theirs") / "api.key"
    key.write_text("planted-key-the-planter-knows-0123456789\n")
    key.chmod(0o644)
    os.chown(key, NOBODY, NOBODY)

    def edit(doc: Any) -> None:
        doc["api_key"]["file"] = str(key)

    seeded.write_spec(edit)
    run = seeded.cli("apply")
    assert run.returncode == 1, run.output
    assert f"[api_key].file {key}: {key.parent} is owned by nobody" in run.output
    st = key.stat()  # old code: chmod 0600, chown root, "key kept", and the server served with it
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o644)
    assert not seeded.server_pids()


def planted_record(demo: Demo, number: int, marker: Path) -> Path:
    """A generation record (issue 15's store, `<state_dir>/profile/`) whose spec runs the planter's
    script as the server."""
    script = demo.root / "planted.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    resolved = load_spec(str(demo.spec_path)).resolved
    resolved["server"]["executable"] = str(script)
    record = {
        "generation": number,
        "spec_resolved": resolved,
        "spec_text": "",
        "spec_path": str(demo.spec_path),
    }
    path = demo.state_dir / "profile" / f"{number}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


UNVERIFIED = "its sha256 is not the one reconcile recorded in index.json"


def test_rollback_to_a_planted_generation_record_runs_nothing(seeded: Demo) -> None:
    marker = seeded.root / "ran-as-root"
    path = planted_record(seeded, 1, marker)
    os.chown(path, NOBODY, NOBODY)  # dropped there by another user
    run = seeded.cli("rollback", "1")
    assert not marker.exists(), "the planted record's executable ran"  # old code: it did
    assert run.returncode == 1, run.output
    assert f"{path}: {UNVERIFIED}" in run.output, run.output
    assert "internal error" not in run.output


def test_a_record_added_beside_reconciles_own_is_refused_and_history_says_so(seeded: Demo) -> None:
    assert seeded.cli("apply").returncode == 2  # generation 1, and the index that vouches for it
    marker = seeded.root / "ran-as-root"
    path = planted_record(seeded, 2, marker)
    run = seeded.cli("rollback", "2")
    assert run.returncode == 1 and not marker.exists(), run.output
    assert f"{path}: {UNVERIFIED}" in run.output, run.output
    history = seeded.cli("history")
    assert history.returncode == 0, history.output
    assert "first generation" in history.stdout
    # listed as skipped, with the reason: never as a generation of its own
    assert f"   2  skipped: {path}: {UNVERIFIED}" in history.stdout, history.stdout
    assert "2  20" not in history.stdout
    diff = seeded.cli("diff", "1", "2")
    assert diff.returncode == 1 and UNVERIFIED in diff.output, diff.output


@pytest.mark.parametrize("body", ["[1, 2]", '{"changes": 5}', '{"changes": ["x"]}', "{not json"])
def test_a_malformed_generation_record_gives_one_line_naming_it(tmp_path: Path, body: str) -> None:
    """A record nobody vouched for (no index entry), malformed or not: one line naming it."""
    state = tmp_path / "state"
    (state / "profile").mkdir(parents=True)
    record = state / "profile" / "1.json"
    record.write_text(body)
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[machine]\nstate_dir = "{state}"\n')
    for args in (("diff", "1", "1"), ("rollback", "1")):
        proc = subprocess.run(
            [sys.executable, "-m", "reconcile", *args, "--spec", str(spec)], capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        assert "internal error" not in out and "Traceback" not in out, (args, out)
        assert f"{record}: {UNVERIFIED}" in out, (args, out)
        assert proc.returncode == 1, (args, out)


def test_the_strict_modes_rule(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    assert parent_problem(str(ours / "state" / "x")) is None  # what does not exist yet, we make
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    assert "is group-root-writable (mode 0775)" in str(parent_problem(str(group / "api.key")))
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert "is world-writable" in str(parent_problem(str(sticky / "demo.log")))  # its own dir: no
    (sticky / "mine").mkdir(mode=0o755)
    assert parent_problem(str(sticky / "mine" / "demo.log")) is None  # below it, a dir of ours: yes
    assert parent_problem(str(sticky / "new" / "state")) is None  # one we will make: yes
    theirs = nobodys_dir(sticky / "theirs")
    assert "owned by nobody" in str(parent_problem(str(theirs / "demo.log")))
    planted = ours / "api.key"
    planted.write_text("k")
    os.chown(planted, NOBODY, NOBODY)
    assert "owned by nobody" in str(parent_problem(str(planted)))
    assert parent_problem(str(planted), {0, NOBODY}) is None  # e.g. [api_key] owner = that user


def test_a_root_dir_a_system_group_may_write_is_trusted_above_the_paths_own_dir(tmp_path: Path) -> None:
    # Ubuntu's /var/log is root:syslog 0775; the reference spec logs to /var/log/vllm/nemotron.log.
    for gid, trusted in ((4, True), (1234, False)):  # adm (a system group); a user's group
        log = tmp_path / f"log-{gid}"
        (log / "vllm").mkdir(parents=True)
        os.chown(log, 0, gid)
        log.chmod(0o775)
        problem = parent_problem(str(log / "vllm" / "nemotron.log"))
        assert (problem is None) is trusted, problem
        # Never as the path's own directory: there a member could swap the file itself.
        assert "writable" in str(parent_problem(str(log / "nemotron.log")))
        log.chmod(0o777)
        assert "world-writable" in str(parent_problem(str(log / "vllm" / "nemotron.log")))


def test_ensure_dir_makes_private_dirs_whatever_the_umask_and_never_walks_a_link(tmp_path: Path) -> None:
    with umask(0o000):
        ensure_dir(str(tmp_path / "a" / "b"))
    assert mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "a" / "b").chmod(0o755)  # made by an older reconcile
    ensure_dir(str(tmp_path / "a" / "b"))
    assert mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "file").write_text("")
    with pytest.raises(UnsafePath, match="is not a directory"):
        ensure_dir(str(tmp_path / "file" / "x"))


def under_umask(demo: Demo, mask: int, *args: str) -> Run:
    argv = ["sh", "-c", f'umask {mask:03o}; exec "$@"', "sh", *demo.command(*args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=demo.env(), cwd=demo.root)
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    demo.runs.append(run)
    return run


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# Issue 12 owns the pidfile and the server's launch record (server-<name>.json).
ISSUE_12 = (".pid", ".json")


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_modes_come_out_the_same_whatever_the_callers_umask(demo: Demo, mask: int) -> None:
    run = under_umask(demo, mask, "apply")
    assert run.returncode == 2, run.output
    assert under_umask(demo, mask, "status").returncode == 0
    # Trees it builds: readable by the server's user, writable by nobody else (022).
    # (demo.venv and demo.model_dir are links to their realizations in the store: their targets.)
    for tree in (demo.venv, demo.venv / "bin", demo.model_dir):
        real = Path(os.path.realpath(tree))
        assert mode(real) == 0o755, (real, oct(mode(real)))
    for path in [*demo.venv.rglob("*"), *demo.model_dir.rglob("*")]:
        if not path.is_symlink():
            assert not mode(path) & 0o022, (path, oct(mode(path)))
    assert not mode(demo.log) & 0o022, oct(mode(demo.log))  # old code under 000: 0666
    # State: 0700 dirs, 0600 files (077).
    assert mode(demo.state_dir) == 0o700 and mode(demo.state_dir / "generations") == 0o700
    store = demo.state_dir / "store"  # the realizations: trees the server reads (above), not state
    state_files = [p for p in demo.state_dir.rglob("*") if p.is_file() and store not in p.parents]
    names = {p.name for p in state_files}
    assert {"apply.lock", "last-run.json", "1.json", "index.json", "conditions.json"} <= names, names
    for path in state_files:
        if path.name.startswith(f"server-{demo.name}") and path.suffix in ISSUE_12:
            continue
        assert mode(path) == 0o600, (path, oct(mode(path)))
