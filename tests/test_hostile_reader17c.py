"""Issue 24's hostile reader, seventeenth round, part C: the deployment's own life (the HAProxy front, its
config, runtime socket and pid; several deployments; the bench; the hung-engine watchdog; the switch),
re-read as a whole for the first time since the fourth round. Found by reading docs/security.md and
the code alone, each run for real as `nobody`, each seen succeeding on main before its fix unless its
docstring says it was already refused.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from reconcile.errors import SpecError
from reconcile.spec.loader import load_spec
from tests.ownership_support import NOBODY, as_nobody, nobodys_dir
from tests.test_front import needs_haproxy
from tests.test_hostile_reader13 import ROOT_ONLY

if TYPE_CHECKING:
    from reconcile.spec.models import Spec

# --- class 1 and 5: a spec value HAProxy's config reads as more than what its key means -------------


def _fronted(tmp_path: Path, state_dir: str, host: str = "127.0.0.1") -> Path:
    """A one-deployment spec behind [front] (the HAProxy alone is started: no server is needed)."""
    path = tmp_path / "box.toml"
    path.write_text(
        f'[machine]\nstate_dir = "{state_dir}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nhost = "{host}"\nport = 8000\nlog = "{tmp_path / "d.log"}"\n\n[front]\n'
    )
    return path


@pytest.fixture
def front_of() -> Iterator[list[Spec]]:
    """The specs whose HAProxy a test started (actions.front): stopped after it (ours: front_master)."""
    from actions import haproxy
    from reconcile.ownership.membership import front_master

    started: list[Spec] = []
    yield started
    for spec in started:
        pid = front_master(spec)
        if pid is not None:
            haproxy.stop(spec, pid)


def _front_started(spec_path: Path, started: list[Spec]) -> str | None:
    """Load the spec and start its front for real; the load's refusal (None: it loaded and HAProxy runs)."""
    from actions import front

    try:
        spec = load_spec(str(spec_path)).spec
    except SpecError as exc:
        return str(exc)
    started.append(spec)
    front.apply(spec)
    return None


NOBODYS_UNIX_LISTENER = """
import os, socket, sys
path = sys.argv[1]
os.rename(path, path + ".roots")  # nobody's directory: root's socket is theirs to move aside
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
c.sendall(b"nobody listens here\\n")
"""


@ROOT_ONLY
@needs_haproxy
@pytest.mark.parametrize("address", ["unix@{dir}/pub", "abns@h17c-{n}"], ids=["unix", "abstract"])
def test_the_fronts_public_address_is_a_host_never_a_socket_path(
    tmp_path: Path, outside: Path, strangers: list[int], front_of: list[Spec], address: str
) -> None:
    """HAProxy reads a `bind` address's prefix: `unix@PATH` and `abns@NAME` make the front's public
    listener a Unix socket, at a path (or abstract name) the spec's `[server] host` alone names, judged
    by no path rule (a host was written raw: `_host_word` refused only blanks, `#`, quotes and `\\`).
    main (seen): loaded, planned, and HAProxy (root) bound its public listener in nobody's directory;
    nobody moved root's socket aside, bound their own at the name, and the deployment's clients (their
    bearer keys with them) reached nobody's listener. The abstract name: anyone may bind one first."""
    where = nobodys_dir(outside, "pub")
    host = address.format(dir=where, n=os.getpid())
    refused = _front_started(_fronted(tmp_path, str(tmp_path / "state"), host), front_of)
    if refused is not None:
        assert "server.host" in refused and "not a host" in refused, refused
        return
    if host.startswith("abns@"):
        pytest.fail(f"loaded and started: HAProxy's public listener is the abstract socket {host[5:]}:8000")
    sock = f"{where}/pub:8000"
    code = NOBODYS_UNIX_LISTENER
    as_nobody(["/usr/bin/python3", "-c", code, sock], {}, strangers)
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(5)
        client.connect(sock)
        said = client.recv(100)
    assert b"nobody" not in said, f"the front's client reached nobody's listener: {said!r}"


NOBODY_ON_THE_RUNTIME_API = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("ready", flush=True); print("refused", exc, flush=True); sys.exit()
s.sendall(b"set server vllm/blue addr 127.0.0.9 port 9\\n")
print("ready", flush=True)
print("answer", s.recv(4096), flush=True)
"""


@ROOT_ONLY
@needs_haproxy
def test_a_state_dir_with_blanks_never_adds_options_to_the_fronts_admin_socket(
    tmp_path: Path, outside: Path, strangers: list[int], front_of: list[Spec]
) -> None:
    """The front's config names its runtime socket (`stats socket PATH mode 600 level admin`) under
    `[machine] state_dir`, written raw: a state_dir with blanks writes more options on that line.
    `/srv/s uid 65534 name ` (trailing blank) makes the line `stats socket /srv/s uid 65534 name
    /front-d.sock mode 600 level admin ...`: the admin socket at /srv/s, owned by uid 65534. main
    (seen): loaded, `haproxy -c` accepted it, HAProxy (root) made /srv/s nobody's, and nobody's `set
    server vllm/blue addr ...` on it was answered (the runtime API at level admin: where the public
    traffic goes)."""
    state = f"{outside}/s uid {NOBODY} name "
    refused = _front_started(_fronted(tmp_path, state), front_of)
    if refused is not None:
        assert "machine.state_dir" in refused and "HAProxy" in refused, refused
        return
    spy = as_nobody(["/usr/bin/python3", "-c", NOBODY_ON_THE_RUNTIME_API, f"{outside}/s"], {}, strangers)
    out, _ = spy.communicate(timeout=10)
    assert b"answer" not in out, f"nobody used the front's admin socket: {out.decode(errors='replace')}"
