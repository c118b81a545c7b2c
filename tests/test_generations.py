"""Generations end to end with real venvs from a local wheelhouse (tinyserve 1.0 and 2.0, built here):
realizations side by side, history and diff, an offline rollback that holds, reuse, and gc."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.apply.store import MANIFEST
from tests.apply_support import Demo, demo_in
from tests.generations_support import (
    build_wheelhouse,
    cli_env,
    mode,
    offline_env,
    realizations,
    server_cmdline,
    stored_spec,
)


@pytest.fixture
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.getbasetemp())


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def _tinyserve(venv: Path) -> str:
    found = list(venv.glob("lib/python3*/site-packages/tinyserve-*.dist-info"))
    assert len(found) == 1, found
    return found[0].name.removesuffix(".dist-info").split("-")[1]


def test_rollback_switches_offline_to_the_old_realization_restarts_once_and_holds(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    # Generation 1: tinyserve 1.0.
    token = {"HF_TOKEN": "hf_never_stored_6f1c2d"}
    stored_spec(demo, wheels, "1.0", env=token)
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    (a,) = realizations(demo)
    assert _tinyserve(a) == "1.0" and (a / MANIFEST).is_file()
    assert f"{a}/bin/vllm serve" in server_cmdline(demo)
    assert demo.venv.is_symlink() and os.readlink(demo.venv) == str(a)  # the profile link
    config_1 = (demo.model_dir / "config.json").read_bytes()

    # Generation 2: tinyserve 2.0, other args, one more config.json key.
    stored_spec(demo, wheels, "2.0", args={"max-num-seqs": 8}, config={"attention_dropout": 0.0}, env=token)
    second = demo.cli("apply")
    assert second.returncode == 2, second.output
    b = next(p for p in realizations(demo) if p != a)
    assert sorted(realizations(demo)) == sorted([a, b]) and _tinyserve(b) == "2.0" and _tinyserve(a) == "1.0"
    assert f"{b}/bin/vllm serve" in server_cmdline(demo) and os.readlink(demo.venv) == str(b)
    assert json.loads((demo.model_dir / "config.json").read_text())["attention_dropout"] == 0.0
    starts = demo.starts_in_log()

    # Records: 0600 in a 0700 dir, no key in them.
    profile = demo.state_dir / "profile"
    assert mode(profile) == 0o700 and all(mode(p) == 0o600 for p in profile.iterdir())
    key = demo.key_file.read_text().strip()
    assert all(key not in p.read_text() and token["HF_TOKEN"] not in p.read_text() for p in profile.iterdir())
    assert demo.server_environ("HF_TOKEN") == token["HF_TOKEN"]

    history = demo.cli("history")
    assert history.returncode == 0, history.output
    assert "packages: tinyserve 1.0 -> 2.0" in history.stdout
    diff = demo.cli("diff", "1", "2")
    assert diff.returncode == 0, diff.output
    for line in (
        "packages: tinyserve 1.0 -> 2.0",
        "args: --max-num-seqs 4 -> 8",
        "config.json: attention_dropout added",
    ):
        assert line in diff.stdout, diff.stdout
    assert f"venv: {a} -> {b}" in diff.stdout and token["HF_TOKEN"] not in history.stdout + diff.stdout

    # The wheelhouse gone, every index and proxy unreachable: the rollback installs nothing.
    shutil.move(str(wheels), str(tmp_path / "wheels-away"))
    try:
        offline = offline_env(demo)
        started = time.monotonic()
        back = cli_env(demo, "rollback", env=offline)
        took = time.monotonic() - started
        assert back.returncode == 2, back.output
        assert "rolled back to generation 1" in back.stdout
        # Where the rollback's time went, by phase, in its journal and on its report: in the order
        # they ran, the server step inside the Changes, no more in all than the command took.
        ran = demo.generations()[-1]["phases"]
        assert list(ran) == [
            "start", "load", "setup", "lock", "prepare", "plan", "changes", "final plan", "journal",
            "judge", "record",
        ]  # fmt: skip
        server = sum(c["seconds"] for c in demo.generations()[-1]["changes"] if c["resource"] == "server")
        assert min(ran.values()) >= 0 and ran["changes"] >= server > 0
        assert sum(ran.values()) <= took + 0.05, (ran, took)  # /proc's start time: 10 ms ticks
        assert "  phases: start " in back.stdout and " · judge " in back.stdout, back.stdout
        assert f"{a}/bin/vllm serve" in server_cmdline(demo)
        assert demo.starts_in_log() == starts + 1
        assert (demo.model_dir / "config.json").read_bytes() == config_1
        assert demo.server_environ("HF_TOKEN") == token["HF_TOKEN"]  # put back from the spec
        assert sorted(realizations(demo)) == sorted([a, b])  # nothing built
        pid = int(demo.pidfile.read_text().split()[0])

        plan = cli_env(demo, "plan", env=offline)
        assert plan.returncode == 0, plan.output
        assert "held at generation 1 by rollback since" in plan.stdout
        status = cli_env(demo, "status", env=offline)
        assert "held at generation 1 by rollback since" in status.stdout, status.output
        for scheduled in ("apply --scheduled", "apply"):
            again = cli_env(demo, *scheduled.split(), env=offline)
            assert again.returncode == 0, again.output
            assert int(demo.pidfile.read_text().split()[0]) == pid and demo.starts_in_log() == starts + 1
    finally:
        shutil.move(str(tmp_path / "wheels-away"), str(wheels))

    # `resume` ends the hold: the spec (generation 2's content) applies again, from its realization.
    resumed = demo.cli("resume")
    assert "released; it was held at generation 1" in resumed.stdout, resumed.output
    assert demo.cli("apply").returncode == 2
    assert f"{b}/bin/vllm serve" in server_cmdline(demo)
    assert any(line.startswith("*  2") for line in demo.cli("history").stdout.splitlines())
    assert demo.cli("plan").returncode == 0


def test_the_same_inputs_reuse_their_realization_and_gc_keeps_what_is_in_use(
    demo: Demo, wheels: Path
) -> None:
    stored_spec(demo, wheels, "1.0")
    assert demo.cli("apply").returncode == 2
    (a,) = realizations(demo)
    stored_spec(demo, wheels, "2.0")
    assert demo.cli("apply").returncode == 2
    (b,) = [p for p in realizations(demo) if p != a]
    inode = (a / "bin" / "python").lstat().st_ino, (a / MANIFEST).stat().st_mtime_ns

    # Back to 1.0 with other args: generation 3 on realization A, nothing installed.
    stored_spec(demo, wheels, "1.0", args={"max-num-seqs": 6})
    third = demo.cli("apply")
    assert third.returncode == 2, third.output
    assert not [line for line in third.stdout.splitlines() if line.startswith("  ✓ venv")], third.stdout
    assert ((a / "bin" / "python").lstat().st_ino, (a / MANIFEST).stat().st_mtime_ns) == inode
    assert f"{a}/bin/vllm serve" in server_cmdline(demo)

    theirs = demo.root / "store" / "not-a-realization"
    theirs.mkdir()
    kept = demo.cli("gc", "--keep", "2")  # generations 2 and 3: both realizations stay
    assert kept.returncode == 0, kept.output
    assert sorted(realizations(demo)) == sorted([a, b]) and "0 realization(s) removed" in kept.stdout
    gone = demo.cli("gc", "--keep", "1")  # only generation 3 (current, running): B goes
    assert gone.returncode == 0, gone.output
    assert realizations(demo) == [a] and f"removed  {b}" in gone.stdout
    assert "MiB freed" in gone.stdout and not gone.stdout.rstrip().endswith(" 0.0 MiB freed")
    assert f"{a}/bin/vllm serve" in server_cmdline(demo)  # still serving from what was kept
    assert theirs.is_dir()  # only <hash>-venv realizations are ever removed
    assert demo.cli("plan").returncode == 0


def test_a_restart_of_the_same_state_records_no_new_generation(demo: Demo, wheels: Path) -> None:
    import signal

    stored_spec(demo, wheels, "1.0")
    assert demo.cli("apply").returncode == 2
    records = sorted(p.name for p in (demo.state_dir / "profile").glob("[0-9]*.json"))
    for pid in demo.server_pids():
        os.kill(pid, signal.SIGKILL)
    again = demo.cli("apply")  # the server is started again: the same generation
    assert again.returncode == 2, again.output
    assert "generation" not in again.stdout.splitlines()[-1], again.stdout
    assert sorted(p.name for p in (demo.state_dir / "profile").glob("[0-9]*.json")) == records == ["1.json"]
    assert any(
        line.startswith("*  1") and "✓ served" in line for line in demo.cli("history").stdout.splitlines()
    )


def test_a_second_realization_shares_identical_files_by_hard_links(demo: Demo, wheels: Path) -> None:
    from reconcile.apply.store import disk_usage

    stored_spec(demo, wheels, "1.0")
    assert demo.cli("apply").returncode == 2
    (a,) = realizations(demo)
    alone = disk_usage([a])
    stored_spec(demo, wheels, "2.0")
    assert demo.cli("apply").returncode == 2
    (b,) = [p for p in realizations(demo) if p != a]
    together = disk_usage([a, b])
    # Two generations differing by one package: every file of the second that the first holds
    # with the same bytes is a hard link to it. Only .pyc files (they embed their own path) and
    # what names the venv's path (scripts, RECORD, pyvenv.cfg) or the new package stay apart.
    apart = [p for p in b.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_nlink == 1]
    not_pyc = sum(p.stat().st_size for p in apart if p.suffix != ".pyc")
    assert not_pyc < 2**20, sorted(str(p) for p in apart if p.suffix != ".pyc")
    assert together - alone < disk_usage([b]) * 0.6, (alone, together)
    pip_a = next(a.glob("lib/python3*/site-packages/pip/__init__.py"))
    pip_b = next(b.glob("lib/python3*/site-packages/pip/__init__.py"))
    assert pip_a.stat().st_ino == pip_b.stat().st_ino
