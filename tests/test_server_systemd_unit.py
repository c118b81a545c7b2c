"""The systemd supervisor's unit and EnvironmentFile: their text, their modes, `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from actions import systemd_unit
from actions.launching import LaunchInputs, launch_command
from reconcile.spec.models import Spec
from tests.test_server_support import FAKE_VLLM


def make_spec(tmp_path: Path, **server: object) -> Spec:
    key = tmp_path / "api.key"
    key.write_text("sk-unit-secret\n")
    return Spec.model_validate(
        {
            "machine": {"state_dir": str(tmp_path / "state")},
            "model": {"dir": "/models/nemotron"},
            "api_key": {"file": str(key)},
            "server": {
                "name": "nemotron",
                "supervisor": "systemd",
                "executable": FAKE_VLLM,
                "port": 20000,
                "log": str(tmp_path / "log" / "nemotron.log"),
                "stop_timeout": "45s",
                "args": {
                    "hf-overrides": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
                    "enable-prefix-caching": True,
                    "chat-template": "/m/100%$HOME.jinja",
                },
                "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "ODD": 'a "quoted" $VAR `x` back\\slash'},
                **server,
            },
        }
    )


def test_unit_has_the_supervision_settings_and_no_secret(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    unit = systemd_unit.render_unit(spec, command, "/state/server-nemotron.env")
    lines = unit.splitlines()
    for expected in (
        "Type=simple",
        "KillMode=mixed",
        "Restart=on-failure",
        "TimeoutStopSec=45",
        "EnvironmentFile=/state/server-nemotron.env",
        f"StandardOutput=append:{tmp_path}/log/nemotron.log",
        "StandardError=inherit",
        "StandardInput=null",
    ):
        assert expected in lines
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.startswith(f'ExecStart="{FAKE_VLLM}" "serve" "/models/nemotron"')
    assert (
        '"--hf-overrides" "{\\"rope_parameters\\":{\\"factor\\":4.0,\\"rope_type\\":\\"yarn\\"}}"'
        in exec_start
    )
    assert '"/m/100%%$$HOME.jinja"' in exec_start  # no specifier or variable expansion by systemd
    assert "sk-unit-secret" not in unit and "--api-key" not in unit


def test_environment_file_is_0600_holds_the_env_and_is_rewritten_only_on_change(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    units = tmp_path / "units"
    assert systemd_unit.install_unit(spec, command, unit_dir=str(units))
    env_file = Path(systemd_unit.env_file_path(spec))
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert (units / "reconcile-nemotron.service").stat().st_mode & 0o777 == 0o644
    text = env_file.read_text()
    assert 'VLLM_API_KEY="sk-unit-secret"' in text.splitlines()
    assert 'ODD="a \\"quoted\\" \\$VAR \\`x\\` back\\\\slash"' in text.splitlines()
    assert f'RECONCILE_IDENTITY="{command.identity.digest}"' in text.splitlines()
    assert not systemd_unit.install_unit(spec, command, unit_dir=str(units))
    env_file.chmod(0o644)
    assert systemd_unit.install_unit(spec, command, unit_dir=str(units))
    assert env_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    units = tmp_path / "units"
    systemd_unit.install_unit(spec, command, unit_dir=str(units))
    unit = units / "reconcile-nemotron.service"
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert str(unit) not in done.stderr and "reconcile-nemotron" not in done.stderr, done.stderr
    # The check can fail: the same unit with a relative executable is rejected.
    unit.write_text(unit.read_text().replace(f'ExecStart="{FAKE_VLLM}"', 'ExecStart="bin/vllm"'))
    bad = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd runs here: starting a unit is real")
def test_without_systemd_the_start_is_a_clear_error(tmp_path: Path) -> None:
    from reconcile.errors import ActionError

    spec = make_spec(tmp_path)
    with pytest.raises(ActionError, match="systemctl"):
        systemd_unit.start_unit(spec)


def _exposure(unit: Path) -> float:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if "Overall exposure level" in ln)
    return float(line.split(":", 1)[1].split()[0])


def test_the_unit_is_hardened_and_restarts_within_the_crash_loop_guards_limits(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, crash_loop={"max_starts": 4, "window": "15m"}, env={"HF_HOME": "/srv/hf"})
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    lines = systemd_unit.render_unit(spec, command, "/state/server-nemotron.env").splitlines()
    for expected in (
        "StartLimitBurst=4",
        "StartLimitIntervalSec=900",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
        "DeviceAllow=/dev/nvidia-uvm-tools rw",
        "DeviceAllow=/dev/nvidia-modeset rw",
        "DeviceAllow=/dev/nvidia0 rw",
        "DeviceAllow=/dev/nvidia15 rw",
        "CapabilityBoundingSet=",
    ):
        assert expected in lines, expected
    assert lines.index("StartLimitBurst=4") < lines.index("[Service]")  # a [Unit] setting
    writable = next(ln for ln in lines if ln.startswith("ReadWritePaths="))
    for path in ("/root/.cache", "/root/.triton", "/root/.nv", "/srv/hf", f"{tmp_path}/log"):
        assert f'"-{path}"' in writable, path
    assert not any(ln.startswith("User=") for ln in lines)  # root, as before, unless [server].user
    assert not any(ln.startswith("MemoryDenyWriteExecute") for ln in lines)  # the JIT needs W+X


def test_user_and_gpu_count_shape_the_unit(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, user="nobody")
    spec = spec.model_copy(update={"gpu": Spec.model_validate({"gpu": {"count": 2}}).gpu})
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    lines = systemd_unit.render_unit(spec, command, "/state/server-nemotron.env").splitlines()
    assert "User=nobody" in lines
    assert "DeviceAllow=/dev/nvidia1 rw" in lines and "DeviceAllow=/dev/nvidia2 rw" not in lines
    import pwd

    home = pwd.getpwnam("nobody").pw_dir
    assert f'"-{home}/.cache"' in next(ln for ln in lines if ln.startswith("ReadWritePaths="))


def test_an_unknown_user_is_a_clear_error(tmp_path: Path) -> None:
    from reconcile.errors import ActionError

    spec = make_spec(tmp_path, user="no-such-user-here")
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    with pytest.raises(ActionError, match="no such user on this machine"):
        systemd_unit.render_unit(spec, command, "/state/server-nemotron.env")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_rates_the_hardened_unit_ok(tmp_path: Path) -> None:
    """Before the hardening: 9.6 UNSAFE. As root now about 4.3, with a User= lower still."""
    command_for = {}
    exposure = {}
    for user in (None, "nobody"):
        spec = make_spec(tmp_path, **({"user": user} if user else {}))
        command_for[user] = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
        unit = tmp_path / f"{user or 'root'}" / "reconcile-nemotron.service"
        unit.parent.mkdir()
        unit.write_text(systemd_unit.render_unit(spec, command_for[user], "/state/server-nemotron.env"))
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
        exposure[user] = _exposure(unit)
    assert exposure[None] < 5.0 and exposure["nobody"] < exposure[None], exposure
