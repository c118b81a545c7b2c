"""The [front] section and its HAProxy: what a spec may say, the config haproxy itself accepts, and a
pidfile that names someone else's process (never signalled, never taken for ours)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from actions.haproxy import render
from reconcile.errors import SpecError
from reconcile.identity import color_socket
from reconcile.ownership.membership import front_master
from reconcile.spec.loader import load_spec

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy")


def _spec(tmp_path: Path, front: str = "[front]\n") -> Path:
    path = tmp_path / "box.toml"
    path.write_text(
        f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nport = 8000\nlog = "{tmp_path / "d.log"}"\n\n{front}'
    )
    return path


def test_front_ports_must_be_two_and_not_the_public_one(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(str(_spec(tmp_path, "[front]\nports = [8000, 8001]\n")))
    assert "front.ports: two different ports, neither of them [server] port" in str(caught.value)
    spec = load_spec(str(_spec(tmp_path))).spec
    assert spec.front is not None and spec.front.blue_green == "auto" and spec.front.ports == []


@needs_haproxy
def test_haproxy_accepts_the_config_with_the_inactive_color_disabled(tmp_path: Path) -> None:
    spec = load_spec(str(_spec(tmp_path))).spec
    text = render(spec, "green")
    blue, green = (color_socket(str(tmp_path / "state"), "d", c) for c in ("blue", "green"))
    assert f"    server blue unix@{blue} disabled\n    server green unix@{green}\n" in text
    assert "bind 127.0.0.1:8000" in text and "mode 600 level admin" in text
    check = subprocess.run(["haproxy", "-c", "-f", "/dev/stdin"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_pidfile_naming_another_users_process_is_not_our_front(tmp_path: Path) -> None:
    spec = load_spec(str(_spec(tmp_path))).spec
    (tmp_path / "state").mkdir(mode=0o700)
    config = tmp_path / "state" / "front-d.cfg"
    # A process of nobody's whose command line even names our config: still not ours.
    argv = ["/bin/sh", "-c", "sleep 60", str(config)]  # sh stays, its $0 our config's path
    stranger = subprocess.Popen(argv, user="nobody", group="nogroup", start_new_session=True)
    try:
        (tmp_path / "state" / "front-d.pid").write_text(f"{stranger.pid}\n")
        assert front_master(spec) is None
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()
