"""The venv actions with a real venv, real pip (and uv where it exists), PyPI and a local wheelhouse.

One venv is made per module (ensurepip costs seconds on two cores); each test installs distinct
packages so the tests do not depend on one another's order.
"""

from __future__ import annotations

import base64
import http.server
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from actions import venv as venv_action
from reconcile.errors import ActionError
from reconcile.spec.models import Venv


def _uv_dir() -> str | None:
    uv = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    return os.path.dirname(uv) if os.access(uv, os.X_OK) else None


def _py(venv: Venv, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([venv_action._python(venv), "-c", code], capture_output=True, text=True)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    spec = Venv(path=str(tmp_path_factory.mktemp("venvs") / "app"), python=sys.executable)
    with pytest.MonkeyPatch.context() as mp:  # with pip: the pip tests below install with it
        mp.setenv(
            "PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d != _uv_dir())
        )
        result = venv_action.create(spec)
    assert result.changed and result.message == f"created {spec.path} with {sys.executable}"
    yield spec


@pytest.fixture
def isolated_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the spec decides where packages come from: no pip.conf, no PIP_* from this machine."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith("PIP_") and name not in ("PIP_CONFIG_FILE", "PIP_CERT"):
            monkeypatch.delenv(name)


@pytest.fixture
def no_uv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    uv = _uv_dir()
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != uv]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))


def test_create_twice_changes_nothing_the_second_time(made: Venv) -> None:
    assert _py(made, "import sys; print(sys.prefix)").stdout.strip() == made.path

    again = venv_action.create(made)

    assert not again.changed
    assert again.message == f"{made.path} is already a venv as the spec says"


def test_extra_site_packages_become_importable_and_go_away_again(made: Venv, tmp_path: Path) -> None:
    extra = tmp_path / "other-env-site-packages"
    extra.mkdir()
    (extra / "reconcile_extra_probe.py").write_text("WHERE = 'extra'\n")
    with_extra = made.model_copy(update={"extra_site_packages": [str(extra)]})

    added = venv_action.create(with_extra)

    assert added.changed and venv_action.PTH_NAME in added.message
    assert _py(made, "import reconcile_extra_probe as m; print(m.WHERE)").stdout == "extra\n"
    assert not venv_action.create(with_extra).changed

    removed = venv_action.create(made)
    assert removed.changed and "removed" in removed.message
    assert _py(made, "import reconcile_extra_probe").returncode != 0


def test_a_missing_extra_site_packages_dir_is_refused(made: Venv, tmp_path: Path) -> None:
    spec = made.model_copy(update={"extra_site_packages": [str(tmp_path / "nope")]})
    with pytest.raises(ActionError, match="is not a directory"):
        venv_action.create(spec)


def test_system_site_packages_is_switched_in_place(made: Venv) -> None:
    sees_base = (
        "import sys; print(any(p.startswith(sys.base_prefix) and 'site-packages' in p for p in sys.path))"
    )
    assert _py(made, sees_base).stdout == "False\n"

    switched = venv_action.create(made.model_copy(update={"system_site_packages": True}))
    try:
        assert switched.changed and "include-system-site-packages false -> true" in switched.message
        assert _py(made, sees_base).stdout == "True\n"
    finally:
        assert venv_action.create(made).changed
    assert _py(made, sees_base).stdout == "False\n"


@pytest.mark.usefixtures("no_uv_on_path")
def test_install_from_the_index_upgrades_by_specifier_with_pip(made: Venv) -> None:
    first = venv_action.install(made, {"ninja": "==1.11.1.1"})
    assert first.changed and "installed with pip: ninja" in first.message
    assert venv_action.installed_versions(venv_action._python(made), ["ninja"]) == {"ninja": "1.11.1.1"}
    ninja = os.path.join(made.path, "bin", "ninja")
    assert subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout.startswith("1.11.1")

    upgraded = venv_action.install(made, {"ninja": "==1.13.0"})

    assert upgraded.changed and "ninja 1.11.1.1 -> 1.13.0" in upgraded.message
    assert subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout.startswith("1.13.0")
    again = venv_action.install(made, {"ninja": "==1.13.0"})
    assert not again.changed and again.message == "already satisfied: ninja 1.13.0"
    assert not venv_action.install(made, {"ninja": "*"}).changed


@pytest.mark.usefixtures("isolated_pip", "no_uv_on_path")
def test_offline_install_takes_the_wheelhouse_version_without_deps(made: Venv, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
            str(wheelhouse),
            "requests==2.31.0",
        ],
        check=True,
        capture_output=True,
    )
    offline = made.model_copy(
        update={
            "wheelhouse": str(wheelhouse),
            "no_deps": True,
            "index_url": "http://127.0.0.1:9/unreachable/simple",  # ignored offline; fails if used
        }
    )

    result = venv_action.install(offline, {"requests": "*"})

    assert result.changed and "requests 2.31.0" in result.message  # PyPI's newest is later
    found = venv_action.installed_versions(venv_action._python(made), ["requests", "urllib3"])
    assert found == {"requests": "2.31.0"}  # its dependency urllib3 was not pulled in
    assert not venv_action.install(offline, {"requests": "*"}).changed


@pytest.mark.usefixtures("isolated_pip", "no_uv_on_path")
def test_a_failing_install_raises_with_pips_error_lines(made: Venv, tmp_path: Path) -> None:
    (tmp_path / "empty-wheelhouse").mkdir()
    offline = made.model_copy(update={"wheelhouse": str(tmp_path / "empty-wheelhouse")})

    with pytest.raises(ActionError) as failed:
        venv_action.install(offline, {"reconcile-no-such-dist": "==1.0"})

    message = str(failed.value)
    assert message.startswith("pip install reconcile-no-such-dist==1.0 failed:")
    assert "ERROR: No matching distribution found for reconcile-no-such-dist==1.0" in message


@pytest.mark.usefixtures("isolated_pip", "no_uv_on_path")
def test_an_install_past_its_timeout_fails_without_showing_index_credentials(
    made: Venv, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        monkeypatch.setattr(venv_action, "INSTALL_TIMEOUT_S", 3.0)
        private = made.model_copy(
            update={"index_url": f"http://reconcile:s3cret-token@127.0.0.1:{port}/simple"}
        )

        with pytest.raises(ActionError) as failed:
            venv_action.install(private, {"reconcile-no-such-dist": "*"})

    assert "no answer within 3s" in str(failed.value)
    assert f"--index-url http://127.0.0.1:{port}/simple" in str(failed.value)
    assert "s3cret-token" not in str(failed.value)


class _RecordingIndex(http.server.BaseHTTPRequestHandler):
    """An index that wants Basic auth; notes each request's credentials and the asking process's argv."""

    seen: ClassVar[list[tuple[str | None, str]]] = []

    def do_GET(self) -> None:
        peer = self.client_address[:2]
        argv = next(
            (
                " ".join(psutil.Process(c.pid).cmdline())
                for c in psutil.net_connections(kind="tcp")
                if c.pid is not None and c.laddr and tuple(c.laddr)[:2] == peer
            ),
            "",
        )
        self.seen.append((self.headers.get("Authorization"), argv))
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.usefixtures("isolated_pip", "no_uv_on_path")
def test_index_credentials_reach_pip_but_never_its_command_line(made: Venv) -> None:
    """Issue 13: credentials in an index URL were on pip's command line (/proc/PID/cmdline is
    world-readable). Now the URL goes bare and pip reads them from a private netrc."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    private = made.model_copy(
        update={"extra_index_urls": [f"http://reconcile:s3cret-token@127.0.0.1:{port}/simple"]}
    )
    try:
        with pytest.raises(ActionError) as failed:
            venv_action.install(private, {"reconcile-no-such-dist": "*"})
    finally:
        server.shutdown()
    assert _RecordingIndex.seen, "pip never asked the index"
    expected = "Basic " + base64.b64encode(b"reconcile:s3cret-token").decode()
    for auth, argv in _RecordingIndex.seen:
        assert auth == expected
        assert "pip" in argv and "s3cret-token" not in argv, argv
    assert "s3cret-token" not in str(failed.value)
    assert not [p for p in Path(tempfile.gettempdir()).glob("reconcile-netrc-*")]  # removed after


@pytest.mark.usefixtures("no_uv_on_path")
def test_pip_output_reaches_the_log_line_by_line_and_as_a_summary(
    made: Venv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="actions.venv")

    venv_action.install(made, {"six": "==1.16.0"})

    records = [r.getMessage() for r in caplog.records if r.name == "actions.venv"]
    assert len(records) == 1
    assert "Successfully installed six-1.16.0" in records[0]
    assert "Collecting" not in records[0] and "Downloading" not in records[0]
    lines = [r.getMessage() for r in caplog.records if r.name == "actions.venv.output"]
    assert any(line.startswith("Collecting six==1.16.0") for line in lines), lines  # as pip printed them
    assert any(line.startswith("Successfully installed six-1.16.0") for line in lines)


@pytest.mark.skipif(_uv_dir() is None, reason="uv is not installed")
def test_installer_uv_installs_into_the_venv(made: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_uv_dir()}{os.pathsep}{os.environ['PATH']}")

    result = venv_action.install(made.model_copy(update={"installer": "uv"}), {"attrs": "==23.2.0"})

    assert result.changed and result.message == "installed with uv: attrs 23.2.0"
    assert _py(made, "import attrs; print(attrs.__version__)").stdout == "23.2.0\n"


def test_auto_follows_the_benchmark_when_uv_is_on_path(
    made: Venv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert venv_action.installer_for(made) == "pip"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text("#!/bin/sh\n")
    (bin_dir / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert venv_action.installer_for(made) == ("uv" if venv_action.UV_IS_FASTER else "pip")
    assert venv_action.installer_for(made.model_copy(update={"installer": "pip"})) == "pip"


def test_installer_uv_without_uv_says_so(made: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ActionError, match="uv is not on PATH"):
        venv_action.install(made.model_copy(update={"installer": "uv"}), {"reconcile-absent": "*"})


def test_a_venv_of_another_python_release_is_refused_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "old-venv"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / "pyvenv.cfg").write_text(
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.8.10\n"
    )

    with pytest.raises(ActionError, match=r"made with Python 3\.8.*move it aside"):
        venv_action.create(Venv(path=str(path), python=sys.executable))

    assert (path / "pyvenv.cfg").read_text().endswith("version = 3.8.10\n")


def test_a_directory_that_is_not_a_venv_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("keep me\n")
    with pytest.raises(ActionError, match="is not a venv"):
        venv_action.create(Venv(path=str(tmp_path), python=sys.executable))
    assert os.listdir(tmp_path) == ["data.txt"]


def test_a_missing_interpreter_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match=r"'python3\.99' not found.*python3\.99-venv"):
        venv_action.create(Venv(path=str(tmp_path / "v"), python="python3.99"))


@pytest.mark.skipif(_uv_dir() is None, reason="uv is not installed")
def test_with_uv_on_path_the_venv_is_made_without_ensurepip_and_uv_installs_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{_uv_dir()}{os.pathsep}{os.environ['PATH']}")
    spec = Venv(path=str(tmp_path / "fast"), python=sys.executable)
    assert venv_action.create(spec).changed
    assert not list((tmp_path / "fast").glob("lib/python3*/site-packages/pip"))  # no ensurepip
    assert venv_action.install(spec, {"attrs": "==23.2.0"}).message == "installed with uv: attrs 23.2.0"
    assert _py(spec, "import attrs; print(attrs.__version__)").stdout == "23.2.0\n"
    # Without uv later, the venv gets pip back (the planner asks for it; create restores it).
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert "restored pip" in venv_action.create(spec).message
