"""`reconcile timer`: the unit texts (checked by `systemd-analyze verify` where it runs), install and
remove on real files, and the cron line run for real by /bin/sh with flock."""

from __future__ import annotations

import configparser
import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reconcile.cli import main
from reconcile.errors import ReconcileError
from reconcile.unattended import timer as scheduling

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def write_spec(root: Path) -> Path:
    spec = root / "box.toml"
    spec.write_text(f'[machine]\nstate_dir = "{root / "state"}"\n\n[api_key]\nfile = "{root / "api.key"}"\n')
    return spec


def unit(path: Path) -> configparser.ConfigParser:
    parsed = configparser.ConfigParser(interpolation=None, strict=False)
    parsed.optionxform = str  # type: ignore[assignment,method-assign]
    parsed.read(path)
    return parsed


def verify(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("every", "calendar", "cron"),
    [
        ("5m", "*-*-* *:00/5:00", "*/5 * * * *"),
        ("30m", "*-*-* *:00/30:00", "*/30 * * * *"),
        ("2h", "*-*-* 00/2:00:00", "0 */2 * * *"),
        ("1d", "*-*-* 00:00:00", "0 0 * * *"),
    ],
)
def test_every_is_said_the_same_way_to_systemd_and_cron(every: str, calendar: str, cron: str) -> None:
    parsed = scheduling.parse_every(every)
    assert (parsed.on_calendar, parsed.cron) == (calendar, cron)


@pytest.mark.parametrize("every", ["7m", "90s", "5h", "25h", "soon", "0"])
def test_intervals_that_cannot_stay_even_are_refused(every: str) -> None:
    with pytest.raises(ReconcileError, match="--every"):
        scheduling.parse_every(every)


@needs_analyze
def test_systemd_reads_the_calendar_as_five_minute_ticks() -> None:
    done = subprocess.run(
        ["systemd-analyze", "calendar", "--iterations=3", scheduling.parse_every("5m").on_calendar],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    minutes = [int(m) for m in re.findall(r"\d\d:(\d\d):00", done.stdout)]
    assert len(minutes) >= 3 and all(m % 5 == 0 for m in minutes)


def test_install_writes_a_oneshot_service_and_a_persistent_randomized_timer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    units = tmp_path / "units"

    rc = main(
        [
            "timer",
            "install",
            "--spec",
            str(spec),
            "--every",
            "15m",
            "--unit-dir",
            str(units),
            "--textfile",
            str(tmp_path / "metrics" / "reconcile.prom"),
        ]
    )

    assert rc == 0
    service, timer = unit(units / "reconcile-apply.service"), unit(units / "reconcile-apply.timer")
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["SuccessExitStatus"] == "2"
    exec_start = service["Service"]["ExecStart"]
    for word in ("apply", "--scheduled", "--quiet", str(spec), "--textfile", "--lock-timeout"):
        assert f'"{word}' in exec_start
    assert timer["Timer"]["OnCalendar"] == "*-*-* *:00/15:00"
    assert timer["Timer"]["RandomizedDelaySec"] == "180"
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Timer"]["Unit"] == "reconcile-apply.service"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert oct((units / "reconcile-apply.timer").stat().st_mode & 0o777) == "0o644"
    out = capsys.readouterr().out
    assert "not a directory systemd loads units from" in out and "enable --now reconcile-apply.timer" in out


@needs_analyze
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    units = tmp_path / "units"
    assert main(["timer", "install", "--spec", str(spec), "--unit-dir", str(units)]) == 0

    done = verify(units / "reconcile-apply.timer", units / "reconcile-apply.service")

    assert done.returncode == 0, done.stderr
    assert "reconcile-apply" not in done.stderr, done.stderr
    # The check can fail: a missing interpreter, or a calendar systemd cannot read, is rejected.
    service, timer = units / "reconcile-apply.service", units / "reconcile-apply.timer"
    good = service.read_text()
    service.write_text(re.sub(r'ExecStart="[^"]+"', 'ExecStart="/nonexistent/python3"', good))
    assert "is not executable" in verify(service).stderr
    service.write_text(good)
    timer.write_text(re.sub(r"OnCalendar=.*", "OnCalendar=every tuesday-ish", timer.read_text()))
    assert verify(timer).returncode != 0


def test_install_twice_changes_nothing_and_remove_deletes_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    units = tmp_path / "units"
    argv = ["timer", "install", "--spec", str(spec), "--unit-dir", str(units)]
    assert main(argv) == 0
    stamp = (units / "reconcile-apply.service").stat().st_ino
    capsys.readouterr()

    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("unchanged:")
    assert (units / "reconcile-apply.service").stat().st_ino == stamp

    assert main(["timer", "remove", "--unit-dir", str(units)]) == 0
    assert sorted(os.listdir(units)) == []
    assert "removed" in capsys.readouterr().out
    assert main(["timer", "remove", "--unit-dir", str(units)]) == 0
    assert "no reconcile-apply units" in capsys.readouterr().out


def test_a_timer_for_a_spec_that_does_not_load_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text("[machine]\nstate_dir = 'relative/path'\n")

    assert main(["timer", "install", "--spec", str(spec), "--unit-dir", str(tmp_path / "units")]) == 1

    assert "state_dir" in capsys.readouterr().err
    assert not (tmp_path / "units").exists()


def cron_command(spec: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["timer", "cron", "--spec", str(spec), "--every", "5m", "--randomized-delay", "0"]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#") and "=" not in ln.split()[0]]
    assert len(lines) == 1
    fields = lines[0].split(None, 6)
    assert fields[:6] == ["*/5", "*", "*", "*", "*", "root"]
    assert "SHELL=/bin/sh" in text
    return fields[6].replace("\\%", "%")  # what cron hands to /bin/sh


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.skipif(shutil.which("flock") is None, reason="no flock(1)")
def test_the_cron_line_applies_quietly_and_speaks_only_when_apply_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path)
    command = cron_command(spec, capsys)

    first = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)

    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")  # apply exit 2: changed, converged
    assert (tmp_path / "api.key").exists()
    assert "Apply converged" in (tmp_path / "state" / "timer.log").read_text()
    second = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert (second.stdout, second.stderr) == ("", "")
    assert (tmp_path / "state" / "timer.log").read_text().endswith("converged, nothing to do\n")

    spec.write_text(spec.read_text() + "\n[server]\nport = 'x'\n")
    failed = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)

    assert "reconcile apply exited 1" in failed.stdout  # what cron mails
    assert "server" in failed.stdout  # the end of the log, with the error


@pytest.mark.skipif(shutil.which("flock") is None, reason="no flock(1)")
def test_a_cron_tick_while_the_last_one_runs_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path)
    command = cron_command(spec, capsys)
    assert (tmp_path / "state").is_dir()  # timer cron made it (root's, 0700), as apply would
    with open(tmp_path / "state" / "timer.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what the running tick's flock(1) holds

        tick = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)

    assert (tick.returncode, tick.stdout) == (0, "")
    assert not (tmp_path / "api.key").exists()


ROOT = Path(__file__).resolve().parents[1]


@needs_analyze
@pytest.mark.skipif(not os.access("/usr/bin/git", os.X_OK), reason="the drop-in names /usr/bin/git")
def test_the_fleet_docs_pull_drop_in_verifies_with_the_service(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "fleets.md").read_text()
    [drop_in] = re.findall(r"```ini\n(.*?)```", doc, re.S)
    units = tmp_path / "units"
    assert main(["timer", "install", "--spec", str(write_spec(tmp_path)), "--unit-dir", str(units)]) == 0
    conf = units / "reconcile-apply.service.d" / "pull.conf"
    conf.parent.mkdir()
    conf.write_text(drop_in)

    assert verify(units / "reconcile-apply.service").returncode == 0
    # verify reads the drop-in: the same line naming a git that is not there (without "-") is rejected.
    conf.write_text(drop_in.replace("-/usr/bin/git", "/nonexistent/git"))
    assert "/nonexistent/git is not executable" in verify(units / "reconcile-apply.service").stderr
