"""Wedges (the same failure on every run until a person steps in) and misleading messages, from issue 13:
a damaged last-run.json, a state_dir that is a file, config values that passed plan and broke apply,
a full disk during the model copy and during the venv's creation (a real small tmpfs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import venv as venv_action
from actions.model import download
from reconcile.cli import main
from reconcile.errors import ActionError
from reconcile.spec.models import Model, Venv

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def write_spec(root: Path, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "box.toml"
    state, key = json.dumps(str(root / "state")), json.dumps(str(root / "api.key"))
    spec.write_text(f"[machine]\nstate_dir = {state}\n\n[api_key]\nfile = {key}\n{extra}")
    return spec


@pytest.mark.parametrize(
    "counters",
    ["garbage", {"changes_total": [1, 2]}, {"runs_total": {"changed": "many"}}, {"changes_total": None}],
    ids=["a-string", "a-list", "a-word", "null"],
)
def test_a_last_run_with_unexpected_counters_is_moved_aside_and_the_run_converges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], counters: object
) -> None:
    spec = write_spec(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    damaged = {"format": "reconcile-last-run/1", "counters": counters}
    (state / "last-run.json").write_text(json.dumps(damaged))

    assert main(["apply", "--spec", str(spec)]) == 2  # the key was made: changed and converged

    err = capsys.readouterr().err
    assert "internal error" not in err
    aside = [p for p in state.iterdir() if p.name.startswith("last-run.json.corrupt-")]
    assert len(aside) == 1 and json.loads(aside[0].read_text()) == damaged
    run = json.loads((state / "last-run.json").read_text())
    assert run["counters"]["runs_total"]["changed"] == 1  # started afresh
    assert main(["apply", "--spec", str(spec)]) == 0
    assert json.loads((state / "last-run.json").read_text())["counters"]["runs_total"]["converged"] == 1


def test_a_state_dir_that_is_a_file_is_an_error_not_a_pause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    (tmp_path / "state").write_text("not a directory\n")

    code = main(["apply", "--scheduled", "--spec", str(spec)])

    err = capsys.readouterr().err
    assert code == 1, err
    assert "paused" not in err and "1970" not in err and "internal error" not in err
    assert f"{tmp_path / 'state'}" in err and "not a directory" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("port = true", "server.port"),
        ("stop_timeout = nan", "server.stop_timeout"),
        ("startup_timeout = inf", "server.startup_timeout"),
        ('env = { "VLLM_PORT=1" = "2" }', 'server.env."VLLM_PORT=1"'),
    ],
)
def test_config_values_that_broke_apply_are_one_line_errors_of_plan_and_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, key: str
) -> None:
    server = f'\n[server]\nname = "x"\nexecutable = "/bin/true"\nmodel = "/m"\nlog = "/tmp/x.log"\n{extra}\n'
    spec = write_spec(tmp_path, server)
    for command in ("plan", "apply"):
        assert main([command, "--spec", str(spec)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"reconcile: {spec}:12: {key}: ") and "\n" not in err, err
    assert not (tmp_path / "api.key").exists()  # apply changed nothing


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted for the test (skipped where mounting is refused)."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def grow(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=128m", str(where)], check=True, capture_output=True)


def test_a_model_copy_bigger_than_the_free_space_is_refused_first_naming_the_destination(
    tmp_path: Path, small_fs: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes(b"{}")
    (src / "model.safetensors").write_bytes(os.urandom(4 * MiB))
    d = small_fs / "models" / "toy"

    # Issue 24: the copy's total is checked against the destination's free space before a byte is
    # written (ENOSPC mid-copy, when the space goes meanwhile, still names the destination file).
    with pytest.raises(ActionError) as caught:
        download(Model(source=str(src), dir=str(d)), progress=False)

    message = str(caught.value)
    assert "model.safetensors: 4.0 MiB" in message and f"free on {small_fs}" in message, message
    assert not d.exists() or [p.name for p in d.iterdir()] == []  # nothing written
    grow(small_fs)
    assert download(Model(source=str(src), dir=str(d)), progress=False).changed
    assert (d / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_a_full_disk_during_venv_creation_says_so_naming_the_path(small_fs: Path) -> None:
    path = small_fs / "venv"

    with pytest.raises(ActionError) as caught:
        venv_action.create(Venv(path=str(path), python=sys.executable))

    message = str(caught.value)
    assert "No space left on device" in message and str(path) in message, message
    assert "free some space" in message and "\n" not in message
    grow(small_fs)  # space freed: the next apply repairs the half-made venv
    venv_action.create(Venv(path=str(path), python=sys.executable))
    assert (
        subprocess.run(
            [str(path / "bin" / "python"), "-m", "pip", "--version"], capture_output=True
        ).returncode
        == 0
    )


def test_a_damaged_textfile_counter_does_not_break_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without a readable spec there is no last-run.json: the counters carry on from the textfile.
    spec = tmp_path / "box.toml"
    spec.write_text("[server\n")
    prom = tmp_path / "reconcile.prom"
    prom.write_text(
        'reconcile_runs_total{outcome="error"} +Inf\nreconcile_runs_total{outcome="changed"} -3\n'
    )

    assert main(["plan", "--spec", str(spec), "--textfile", str(prom)]) == 1

    assert "internal error" not in capsys.readouterr().err
    assert 'reconcile_runs_total{outcome="error"} 1' in prom.read_text().splitlines()
