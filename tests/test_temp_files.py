"""Temp files: reconcile removes only its own (its name pattern, the exact file, the exact directory, a
writer that is gone), never walks a tree to clean it, and never another program's temp file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions.model import download
from reconcile.apply.lock import sweep_stale_temps
from reconcile.host import atomic_write
from reconcile.spec.models import Model, Spec

# Another program's temp files, named the way the old sweep took for ours.
FOREIGN = (".settings.json.abcd1234.tmp", ".config.json.k2j4h5g6.tmp", ".last-run.json.zzzzzzzz.tmp")


def make_spec(tmp_path: Path) -> Spec:
    return Spec.model_validate(
        {
            "machine": {"state_dir": str(tmp_path / "state")},
            "model": {"dir": str(tmp_path / "model")},
            "api_key": {"file": str(tmp_path / "keys" / "api.key")},
        }
    )


@pytest.fixture
def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(child.stdout)


@pytest.fixture
def live_pid() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def plant(directory: Path, names: tuple[str, ...]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / n for n in names]
    for p in paths:
        p.write_bytes(b"someone else's half-written file")
    return paths


def test_the_sweep_leaves_other_programs_temp_files_alone_at_any_depth(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    planted = [
        *plant(tmp_path / "model", FOREIGN),
        *plant(tmp_path / "model" / "tokenizer", FOREIGN),
        *plant(tmp_path / "state", FOREIGN),
        *plant(tmp_path / "state" / "other-app", FOREIGN),
    ]

    removed = sweep_stale_temps(spec)

    assert removed == []
    assert all(p.exists() for p in planted)


def test_the_sweep_removes_its_own_temps_of_a_dead_writer_in_the_exact_directories(
    tmp_path: Path, dead_pid: int
) -> None:
    spec = make_spec(tmp_path)
    mark = f"reconcile-{dead_pid}-a1b2c3d4.tmp"
    ours = [
        *plant(tmp_path / "state", (f".last-run.json.{mark}", f".paused.json.{mark}")),
        *plant(tmp_path / "state" / "generations", (f".3.json.{mark}",)),
        *plant(
            tmp_path / "model",
            (f".config.json.{mark}", f".config.json.bak.{mark}", f"..reconcile-model.json.{mark}"),
        ),
        *plant(tmp_path / "keys", (f".api.key.{mark}",)),
    ]
    # Ours by pattern, but not a file reconcile writes there, or one level down: left alone.
    kept = [
        *plant(tmp_path / "keys", (f".other.key.{mark}",)),
        *plant(tmp_path / "model" / "tokenizer", (f".vocab.txt.{mark}",)),
        *plant(tmp_path / "state" / "other-app", (f".x.json.{mark}",)),
    ]

    removed = sweep_stale_temps(spec)

    assert sorted(removed) == sorted(map(str, ours))
    assert not any(p.exists() for p in ours) and all(p.exists() for p in kept)


def test_the_sweep_leaves_the_temp_of_a_writer_that_still_runs(tmp_path: Path, live_pid: int) -> None:
    # e.g. a `reconcile plan` writing last-run.json while apply starts: its rename must still work.
    spec = make_spec(tmp_path)
    (live,) = plant(tmp_path / "state", (f".last-run.json.reconcile-{live_pid}-a1b2c3d4.tmp",))

    assert sweep_stale_temps(spec) == []
    assert live.exists()


def test_an_atomic_write_names_its_temp_file_as_reconciles_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write(str(tmp_path / "last-run.json"), b"{}")
    assert len(seen) == 1 and seen[0].startswith(f".last-run.json.reconcile-{os.getpid()}-")


def test_a_copy_removes_only_its_own_stale_temps_beside_the_files_it_copies(
    tmp_path: Path, dead_pid: int
) -> None:
    src = tmp_path / "src"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_bytes(b"{}")
    (src / "tokenizer" / "vocab.txt").write_bytes(b"a\n")
    d = tmp_path / "models" / "toy"
    mine = plant(d / "tokenizer", (f".vocab.txt.reconcile-{dead_pid}-a1b2c3d4.tmp",))
    foreign = plant(d / "tokenizer", (".vocab.txt.abcd1234.tmp", ".merges.txt.abcd1234.tmp"))

    download(Model(source=str(src), dir=str(d)), progress=False)

    assert not any(p.exists() for p in mine) and all(p.exists() for p in foreign)


def test_a_writer_killed_mid_write_leaves_a_private_temp_the_sweep_knows_as_ours(tmp_path: Path) -> None:
    """atomic_write's temp (tempfile.mkstemp in the target's directory): the target's mode before its
    first byte whatever the umask, named as host._OWN_TEMP reads it (the file's name, the writer's
    pid); once that writer is gone, the sweep removes it and leaves the target and another program's
    temp alone."""
    import re

    from reconcile.host import _OWN_TEMP, KILL_AT, remove_stale_temps

    target = tmp_path / "last-run.json"
    target.write_text("old")
    target.chmod(0o640)
    foreign = tmp_path / FOREIGN[2]
    foreign.write_text("theirs")
    code = "import os, sys; os.umask(0o022); from reconcile.host import atomic_write; "
    code += f"atomic_write({str(target)!r}, b'new' * 9)"
    env = {**os.environ, KILL_AT: "atomic_write.partial:last-run.json"}
    writer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert writer.returncode == -9, writer.stderr
    temps = [p for p in tmp_path.iterdir() if p not in (target, foreign)]
    assert len(temps) == 1
    temp = temps[0]
    assert (temp.stat().st_mode & 0o777) == 0o640 and temp.read_bytes() == (b"new" * 9)[:13]
    match = re.match(_OWN_TEMP, temp.name)
    assert match and match["name"] == "last-run.json" and match["pid"] != str(os.getpid())
    assert remove_stale_temps(str(tmp_path), None) == [str(temp)]
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, foreign.name])
    assert target.read_text() == "old" and foreign.read_text() == "theirs"


def test_a_write_that_fails_before_its_first_byte_leaves_no_temp_and_no_open_file(tmp_path: Path) -> None:
    """The target is a symlink loop: reading its mode fails (ELOOP) after the temp file is open."""
    (tmp_path / "state.json").symlink_to(tmp_path / "state.json")
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError, match=r"state\.json"):
            atomic_write(str(tmp_path / "state.json"), b"{}")
    assert sorted(os.listdir("/proc/self/fd")) == before  # each temp file's fd closed, not leaked
    assert sorted(os.listdir(tmp_path)) == ["state.json"]  # and the temp file itself removed
