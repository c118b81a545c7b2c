"""How a switch stops the old server: the drain reconcile asks vLLM for (`--shutdown-timeout`, its
default from stop_timeout or the spec's args), the preflight that refuses a stop_timeout cutting it,
and the systemd units' stop times that agree with it."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import pytest

from actions.launching import LaunchInputs, launch_command
from actions.systemd_unit import render_unit
from reconcile.cli import main
from reconcile.preflight.gather import run_preflight
from reconcile.spec.models import Spec
from tests.test_preflight import GOOD, spec


def _argv(server: dict[str, Any], packages: dict[str, str] | None = None) -> list[str]:
    s = spec(server=server)
    return list(launch_command(s, LaunchInputs(packages=packages or {}), key_required=False).argv)


def _tail(argv: list[str]) -> list[str]:
    return argv[argv.index("--shutdown-timeout") :] if "--shutdown-timeout" in argv else []


def test_a_launch_drains_for_stop_timeout_less_vllms_exit_by_default() -> None:
    assert _tail(_argv({})) == ["--shutdown-timeout", "20"]  # stop_timeout's default, 30 s
    assert _tail(_argv({"stop_timeout": "2m"})) == ["--shutdown-timeout", "110"]
    assert _tail(_argv({"stop_timeout": "5s"})) == []  # no room to drain: vLLM's abort


def test_the_specs_shutdown_timeout_is_used_as_written_and_a_vllm_without_the_flag_gets_none() -> None:
    argv = _argv({"args": {"shutdown-timeout": 5}})
    assert argv.count("--shutdown-timeout") == 1 and argv[argv.index("--shutdown-timeout") + 1] == "5"
    assert _tail(_argv({}, {"vllm": "0.10.1"})) == []  # 0.18 brought --shutdown-timeout
    assert _tail(_argv({}, {"vllm": "0.26.0"})) == ["--shutdown-timeout", "20"]


def _drain_findings(s: Spec) -> list[Any]:
    return [f for f in run_preflight(s, GOOD) if f.rule == "server.drain"]


def test_the_preflight_refuses_a_stop_timeout_that_would_sigkill_the_drain_and_names_the_fix() -> None:
    (f,) = _drain_findings(spec(server={"stop_timeout": "25s", "args": {"shutdown-timeout": 20}}))
    assert f.severity == "error"
    assert "stop_timeout 25s would SIGKILL vLLM while it drains" in f.message
    assert f.fix == 'set [server] stop_timeout = "30s", or lower args.shutdown-timeout to 15'
    (ok,) = _drain_findings(spec(server={"stop_timeout": "30s", "args": {"shutdown-timeout": 20}}))
    assert ok.severity == "info" and "up to 20s" in ok.message and "the spec's args" in ok.message


def test_the_preflight_shows_the_default_drain_and_warns_when_there_is_no_room_for_one() -> None:
    (f,) = _drain_findings(spec(server={}))
    assert f.severity == "info"
    assert "drains in-flight requests up to 20s" in f.message and "reconcile's default" in f.message
    (w,) = _drain_findings(spec(server={"stop_timeout": "8s"}))
    assert w.severity == "warning" and "aborts in-flight requests" in w.message
    (bad,) = _drain_findings(spec(server={"args": {"shutdown-timeout": "soon"}}))
    assert bad.severity == "error" and "not a whole number of seconds" in bad.message


def test_the_server_unit_stops_within_stop_timeout_which_outlasts_the_drain() -> None:
    s = spec(server={"stop_timeout": "45s"})
    command = launch_command(s, LaunchInputs(), base_env={"PATH": "/usr/bin"}, key_required=False)
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read_string(render_unit(s, command, "/var/lib/reconcile/server-nemotron.env"))
    drain = int(command.argv[command.argv.index("--shutdown-timeout") + 1])
    assert unit["Service"]["TimeoutStopSec"] == "45" and drain == 35
    assert "--shutdown-timeout" in unit["Service"]["ExecStart"]


def test_the_timers_apply_unit_lets_a_switch_finish_its_drain(tmp_path: Path) -> None:
    demo = tmp_path / "box.toml"
    demo.write_text(
        f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nlog = "{tmp_path / "d.log"}"\nstop_timeout = "2m"\n'
    )
    assert main(["timer", "install", "--spec", str(demo), "--every", "15m", "--unit-dir", str(tmp_path)]) == 0
    service = configparser.ConfigParser(interpolation=None, strict=False)
    service.read(tmp_path / "reconcile-apply.service")
    assert int(service["Service"]["TimeoutStopSec"]) == 180  # stop_timeout 120 s + a minute


@pytest.mark.parametrize("value", ["20", 20])
def test_a_numeric_shutdown_timeout_is_accepted_as_a_string_or_a_number(value: object) -> None:
    (f,) = _drain_findings(spec(server={"stop_timeout": "30s", "args": {"shutdown-timeout": value}}))
    assert f.severity == "info"
