"""Issue 24's hostile reader, twentieth round, part A: the front's colors on Unix sockets (branch
frontuds: `launching.prepare_socket`, `identity.color_socket`, `sockets.key_guard`, HAProxy's
`server <color> unix@<path>`). Read as `nobody` (or as a color's former `[server] user`, whose trust the
spec took back) with only docs/security.md and the code. Each attack runs for real; each was seen
succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from reconcile.errors import ActionError
from reconcile.spec.loader import load_spec
from tests.ownership_support import as_nobody
from tests.test_hostile_reader13 import ROOT_ONLY

if TYPE_CHECKING:
    from reconcile.spec.models import Spec

# --- class 2 and 6: what a color's former server user left in its socket directory --------------------

# Nobody, the color's server user (its directory is theirs), leaves a listener of theirs in it and at the
# socket's name argv[2]: a link to that listener (which HAProxy, root, follows as connect(2) does), a
# FIFO or a directory; each is a thing the next start's `vllm serve --uds` cannot bind over.
NOBODYS_LEFTOVER = r"""
import os, socket, sys
directory, left = sys.argv[1:3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(os.path.join(directory, "nobodys.sock"))
s.listen(8)
{"link": lambda p: os.symlink("nobodys.sock", p), "fifo": os.mkfifo, "dir": os.mkdir}[left](
    os.path.join(directory, "vllm.sock")
)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"nobody listens here\n")
    c.close()
"""


def _color(tmp_path: Path, user: str | None) -> Spec:
    """Blue of a one-deployment fronted spec whose state dir is `tmp_path`'s (its own socket directory);
    under `supervisor = "systemd"` and `user` when one is given."""
    from reconcile.identity import color_spec

    unit = f'supervisor = "systemd"\nuser = "{user}"\n' if user else ""
    path = tmp_path / f"box-{user or 'root'}.toml"
    path.write_text(
        f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nport = 8000\nlog = "{tmp_path / "d.log"}"\n{unit}\n[front]\n'
    )
    return color_spec(load_spec(str(path)).spec, "blue")


@ROOT_ONLY
@pytest.mark.parametrize("left", ["link", "fifo"])
def test_what_a_former_server_user_left_never_stays_the_colors_socket(
    tmp_path: Path, strangers: list[int], left: str
) -> None:
    """Blue ran as `[server] user = "nobody"` (its socket directory nobody's, as prepare_socket makes
    it); nobody leaves `vllm.sock` a link to a listener of theirs beside it, or a FIFO. The spec takes
    the trust back (blue now root's) and a start prepares the directory again: it is root's and 0700
    again, but on main what nobody left stayed (only a socket was removed): the link made every
    connect to blue's socket by name (HAProxy's, root's) reach nobody's listener, and either made the
    server's bind of the path fail (EADDRINUSE: blue never starts). Now the start leaves nothing at the
    socket's name: the server's bind takes it, and a connect reaches the server."""
    from actions.launching import prepare_socket
    from reconcile.identity import server_socket

    as_nobodys, as_roots = _color(tmp_path, "nobody"), _color(tmp_path, None)
    uds = server_socket(as_nobodys)
    assert uds is not None and uds == server_socket(as_roots)
    try:
        prepare_socket(as_nobodys)
        as_nobody(["/usr/bin/python3", "-c", NOBODYS_LEFTOVER, os.path.dirname(uds), left], {}, strangers)
        prepare_socket(as_roots)
        st = os.stat(os.path.dirname(uds))
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            try:  # as `vllm serve --uds` binds it
                server.bind(uds)
            except OSError as exc:
                bound: str | None = f"the server's bind failed: {exc}"
            else:
                server.listen(1)
                bound = None
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                try:
                    client.connect(uds)
                    answer = b"" if bound is None else client.recv(100)
                except OSError as exc:
                    answer = str(exc).encode()
        assert (bound, answer) == (None, b""), f"{bound}; a connect to blue's socket got {answer!r}"
    finally:
        shutil.rmtree(os.path.dirname(uds), ignore_errors=True)


@ROOT_ONLY
def test_a_directory_a_former_server_user_left_at_the_colors_socket_is_named(
    tmp_path: Path, strangers: list[int]
) -> None:
    """The test above's directory member: nobody, blue's former server user, leaves `vllm.sock` a
    directory. Not removed (a tree its former owner may still hold open below: round 20's left-open
    paragraph); on main the start went on to a bind that failed (EADDRINUSE, blue never ready, the
    cause only in vLLM's log). Now the start stops before the server, naming the path and the fix."""
    from actions.launching import prepare_socket
    from reconcile.identity import server_socket

    as_nobodys, as_roots = _color(tmp_path, "nobody"), _color(tmp_path, None)
    uds = server_socket(as_nobodys)
    assert uds is not None
    try:
        prepare_socket(as_nobodys)
        as_nobody(["/usr/bin/python3", "-c", NOBODYS_LEFTOVER, os.path.dirname(uds), "dir"], {}, strangers)
        with pytest.raises(ActionError) as refused:
            prepare_socket(as_roots)
        assert f"{uds} is a directory" in str(refused.value) and f"rm -r {uds}" in str(refused.value)
    finally:
        shutil.rmtree(os.path.dirname(uds), ignore_errors=True)


# --- errors: a /run root cannot write -----------------------------------------------------------------

READ_ONLY_RUN = """
import sys
from pathlib import Path
from tests.test_hostile_reader20a import _color
from actions.launching import prepare_socket
try:
    prepare_socket(_color(Path(sys.argv[1]), None))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@ROOT_ONLY
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1), a mount namespace of its own")
def test_a_read_only_run_is_named_whole_with_what_the_start_needs(tmp_path: Path) -> None:
    """Not an attack: a machine whose /run root cannot write (here a read-only tmpfs over it, in a
    mount namespace of the test's own). On main the error's file was the name relative to its
    descriptor (`cannot prepare reconcile: Read-only file system`, actions.server's wrapping). Now it
    names the color's directory whole, the deployment, and what the start needs."""
    import subprocess
    import sys

    script = f"mount --make-rprivate / && mount -t tmpfs -o ro tmpfs /run && exec {sys.executable} -c "
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script + '"$0" "$1"', READ_ONLY_RUN, str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    if done.returncode != 0 and not done.stdout:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[-200:]}")
    assert done.stdout.startswith("ActionError cannot prepare /run/reconcile/"), done.stdout
    assert "socket directory of d-blue: Read-only file system" in done.stdout
    assert "/run must be writable by root" in done.stdout


# --- class 3: a spec value that moves the server off the socket reconcile guards -----------------------


@pytest.mark.parametrize("flag", ["uds", "ud"])
def test_a_uds_in_the_servers_args_is_refused_at_load(tmp_path: Path, flag: str) -> None:
    """Not an attack of another user's: a careless value. `[server] args = { uds = "/tmp/vllm.sock" }`
    (or `ud`, which vLLM's argparse reads as --uds) loaded on main: behind [front] vLLM took the last
    `--uds`, in /tmp where anyone may make the name first, while readiness, the key guard and HAProxy
    spoke to the color's own socket (the color never became ready, the cause only in vLLM's log);
    without [front] vLLM left the port it was probed on free to anyone. Now the load names the key and
    what to set instead."""
    from reconcile.errors import SpecError

    path = tmp_path / "box.toml"
    path.write_text(
        f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nport = 8000\nlog = "{tmp_path / "d.log"}"\nargs = {{ {flag} = "/tmp/vllm.sock" }}\n\n'
        "[front]\n"
    )
    with pytest.raises(SpecError) as refused:
        load_spec(str(path))
    assert f"{path}:10: server.args.{flag}: is vLLM's --uds, which moves the server off" in str(refused.value)
    assert "set [server] host and port" in str(refused.value)
