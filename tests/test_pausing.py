"""`reconcile pause` / `resume`: the pause file, and a timer-style run (the service's own ExecStart,
as a real process) that only plans while paused and says who paused, when and why."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from reconcile.cli import main
from reconcile.unattended import pause as pausing

STATE = "state"


def write_spec(root: Path) -> Path:
    """A spec whose only resource is an API key file: apply creates it, so a change is visible."""
    spec = root / "box.toml"
    spec.write_text(f'[machine]\nstate_dir = "{root / STATE}"\n\n[api_key]\nfile = "{root / "api.key"}"\n')
    return spec


def service_argv(spec: Path, unit_dir: Path) -> list[str]:
    """The ExecStart of the unit `reconcile timer install` wrote, split the way systemd splits it."""
    assert main(["timer", "install", "--spec", str(spec), "--unit-dir", str(unit_dir)]) == 0
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(unit_dir / "reconcile-apply.service")
    words = shlex.split(unit["Service"]["ExecStart"])
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """What the timer's process gets: no terminal, and a cache of its own."""
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "NO_COLOR": "1"}


def test_pause_records_who_when_and_why(tmp_path: Path) -> None:
    before = time.time()
    new, old = pausing.pause(
        str(tmp_path),
        "bisecting NCCL hangs",
        env={"SUDO_USER": "alice", "SSH_CONNECTION": "10.9.8.7 51234 10.0.0.5 22"},
    )

    data = json.loads((tmp_path / "paused.json").read_text())
    assert old is None
    assert data["user"] == "alice" and data["ssh_client"] == "10.9.8.7"
    assert data["reason"] == "bisecting NCCL hangs" and data["pid"] == os.getpid()
    assert before <= data["since"] <= time.time() and data["until"] is None
    assert oct((tmp_path / "paused.json").stat().st_mode & 0o777) == "0o600"  # state is private
    assert "paused by alice (pid" in new.describe() and "ssh from 10.9.8.7" in new.describe()


def test_resume_removes_the_pause_and_returns_what_it_held(tmp_path: Path) -> None:
    pausing.pause(str(tmp_path), "kernel upgrade", env={"USER": "bob"})

    held = pausing.resume(str(tmp_path))

    assert held is not None and held.user == "bob" and held.reason == "kernel upgrade"
    assert not (tmp_path / "paused.json").exists()
    assert pausing.read_pause(str(tmp_path)) is None
    assert pausing.resume(str(tmp_path)) is None


def test_a_pause_for_a_while_ends_by_itself(tmp_path: Path) -> None:
    pausing.pause(str(tmp_path), "short", duration=0.3, env={"USER": "bob"})
    assert pausing.read_pause(str(tmp_path)) is not None

    time.sleep(0.4)

    assert pausing.read_pause(str(tmp_path)) is None
    assert pausing.read_pause(str(tmp_path), include_expired=True) is not None


def test_a_damaged_pause_file_still_holds_applies_off(tmp_path: Path) -> None:
    (tmp_path / "paused.json").write_text("{not json")

    held = pausing.read_pause(str(tmp_path))

    assert held is not None and "was damaged" in held.reason and "reconcile resume" in held.reason
    # moved aside, and a pause that says so in its place: still held off on the next run
    aside = list(tmp_path.glob("paused.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{not json"
    again = pausing.read_pause(str(tmp_path))
    assert again is not None and again.reason == held.reason


def test_an_empty_reason_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path)

    assert main(["pause", "--spec", str(spec), "--reason", "  "]) == 1

    assert "--reason is empty" in capsys.readouterr().err
    assert not (tmp_path / STATE / "paused.json").exists()


def test_a_scheduled_apply_while_paused_only_plans_and_says_who(tmp_path: Path, env: dict[str, str]) -> None:
    spec = write_spec(tmp_path)
    argv = service_argv(spec, tmp_path / "units")
    assert "--scheduled" in argv
    who = {**env, "SUDO_USER": "carol", "SSH_CONNECTION": "192.0.2.4 40000 192.0.2.1 22"}
    cli = argv[: argv.index("reconcile") + 1]  # python [-P] -m reconcile, as the unit runs it
    paused = subprocess.run(
        [*cli, "pause", "--spec", str(spec), "--reason", "debugging the KV cache"],
        env=who,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert paused.returncode == 0, paused.stderr

    tick = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    assert tick.returncode == 0, tick.stderr
    assert "not applied: paused by carol" in tick.stdout and "ssh from 192.0.2.4" in tick.stdout
    assert "debugging the KV cache" in tick.stdout
    assert "+ api_key" in tick.stdout  # the plan it made instead, since there is drift
    assert not (tmp_path / "api.key").exists()
    last = json.loads((tmp_path / STATE / "last-run.json").read_text())
    assert last["outcome"] == "paused" and last["paused"]["user"] == "carol"
    assert last["pending"] == ["api_key"] and last["scheduled"] is True

    resumed = subprocess.run([*cli, "resume", "--spec", str(spec)], env=env, capture_output=True, text=True)
    assert "resumed; it was paused by carol" in resumed.stdout
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    assert again.returncode == 2, again.stdout + again.stderr
    assert (tmp_path / "api.key").stat().st_size > 0


def test_a_manual_apply_while_paused_runs_and_notes_the_pause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write_spec(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pausing.pause(str(tmp_path / STATE), "watching it by hand", env={"USER": "dave"})

    assert main(["plan", "--spec", str(spec)]) == 2
    assert "scheduled applies are paused by dave" in capsys.readouterr().out
    assert main(["apply", "--spec", str(spec)]) == 2

    out = capsys.readouterr().out
    assert "paused by dave" in out and "this apply runs anyway" in out
    assert (tmp_path / "api.key").exists()
