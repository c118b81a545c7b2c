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
from tests.apply_support import Demo
from tests.ownership_support import NOBODY, as_nobody, nobodys_dir
from tests.test_front import needs_haproxy
from tests.test_hostile_reader5b import live
from tests.test_hostile_reader13 import ROOT_ONLY
from tests.test_liveness import engine_core, server_pid, stop
from tests.test_server_support import Deployment, deployment_in

if TYPE_CHECKING:
    from reconcile.spec.models import Spec

__all__ = ["live"]  # the fixture, from the fifth round: a seeded demo whose one liveness look decides

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


# --- class 4: what the front forwards to a color's loopback port --------------------------------------


@ROOT_ONLY
@needs_haproxy
def test_the_front_never_forwards_a_client_to_a_listener_that_took_the_active_colors_port(
    tmp_path: Path, strangers: list[int], front_of: list[Spec]
) -> None:
    """The front holds the public port whatever happens to the server behind it, and forwards each client
    connection to the active color. The active color's server is down (it crashed, or apply stops it to
    restart it in place when the GPUs hold one server only) and nobody binds what the front forwards to.
    main (seen): HAProxy reached blue by its loopback port (`server blue 127.0.0.1:P`), which nobody
    bound; a client's request to the public port, its `Authorization: Bearer` header with it, reached
    nobody's listener through root's HAProxy, which answered it. Now each color serves on a Unix socket
    (`server blue unix@/run/reconcile/<hash>-blue/vllm.sock`): nobody's listener on the port an older
    spec still names gets nothing (the next test: nobody cannot bind the socket either)."""
    from tests.ownership_support import SPY, received
    from tests.test_server_support import free_port

    public, blue, green = free_port(), free_port(), free_port()
    path = _fronted(tmp_path, str(tmp_path / "state"))
    path.write_text(  # an older spec's [front] ports (still loaded, no longer used)
        path.read_text().replace("port = 8000", f"port = {public}") + f"ports = [{blue}, {green}]\n"
    )
    assert _front_started(path, front_of) is None
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(blue)], {}, strangers)
    with socket.create_connection(("127.0.0.1", public), timeout=5) as client:
        client.sendall(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-the-deployments\r\n\r\n"
        )
        client.recv(100)
    assert "sk-the-deployments" not in received(spy)


NOBODY_BINDS = r"""
import os, socket, sys
print("ready", flush=True)
path = sys.argv[1]
for step in (lambda: os.makedirs(os.path.dirname(path), exist_ok=True), lambda: os.unlink(path)):
    try:
        step()
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(path)
except OSError as exc:
    print("refused", exc.errno, flush=True)
else:
    print("bound", flush=True)
"""


@ROOT_ONLY
def test_nobody_never_binds_a_colors_socket(tmp_path: Path, strangers: list[int]) -> None:
    """The class fix's premise, a new member of the attack above (no such socket on main): blue's socket
    directory made as a start of blue's server makes it (`launching.prepare_socket`), nobody tries to
    make it, to remove the socket and to bind its path. Refused: root's /run/reconcile (0711) and the
    color's directory (0700, the server's user's: root here) let nobody in."""
    from actions.launching import prepare_socket
    from reconcile.identity import color_spec, server_socket

    blue = color_spec(load_spec(str(_fronted(tmp_path, str(tmp_path / "state")))).spec, "blue")
    prepare_socket(blue)
    uds = server_socket(blue)
    assert uds is not None
    binder = as_nobody(["/usr/bin/python3", "-c", NOBODY_BINDS, uds], {}, strangers)
    out, _ = binder.communicate(timeout=10)
    assert out.startswith(b"refused"), f"nobody bound blue's socket: {out.decode(errors='replace')}"
    assert not os.path.lexists(uds)


# --- class 6: a listener of nobody's beside the server, on another address of its port -----------------

# A listener beside the server's 127.0.0.1:PORT, clashing with nothing of it: on 127.0.0.2, or with
# argv[2] "::" on IPv6's wildcard, IPv6 alone (IPV6_V6ONLY).
BESIDE = """
import socket, sys, time
if sys.argv[2:] == ["::"]:
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::", int(sys.argv[1])))
else:
    s = socket.socket()
    s.bind(("127.0.0.2", int(sys.argv[1])))
s.listen(1)
print("ready", flush=True)
time.sleep(600)
"""


def _health(port: int) -> int | None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


@ROOT_ONLY
def test_a_listener_beside_the_server_on_its_port_never_leaves_the_deployment_down(
    demo: Demo, strangers: list[int]
) -> None:
    """Already refused on main, kept as a new member (a listener that does not clash with the server):
    nobody listens on 127.0.0.2:PORT while the deployment's server holds 127.0.0.1:PORT, then a spec
    change asks for a restart. Read in the code, the restart stops the server before it looks at the
    port's holders (actions.server.ensure_running), so a start refused for nobody's listener would leave
    the deployment down. main (seen): the plan's `host.port` preflight names nobody's process and
    blocks the apply before anything is stopped; the server keeps serving. Since the round's open
    listener was closed (the port's rules count the listeners that clash with the server's host): the
    restart goes ahead, its start not refused, and the new server serves."""
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    old = server_pid(demo)
    as_nobody(["/usr/bin/python3", "-c", BESIDE, str(demo.port)], {}, strangers)
    demo.write_spec(lambda doc: doc["server"]["args"].__setitem__("max-num-seqs", 9))
    run = demo.cli("apply")
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output
    assert server_pid(demo) != old, run.output
    assert _health(demo.port) == 200, f"the deployment's server was left down:\n{run.output}"


# --- class 6 (and 1): two deployments that name one key file with other settings ------------------------


def test_two_deployments_never_name_one_key_file_with_two_owners(tmp_path: Path) -> None:
    """Deployment chat names `[api_key] file = K` (root's, 0600); deployment draft names the same K with
    `owner = "nobody"` (a table copied from another machine). Each apply's key step puts K in its own
    deployment's settings, one after the other. main (seen): chat's step made K root's, draft's step then
    chowned it to nobody:nogroup ("key kept"): the key chat's server is started with was nobody's to read,
    and every apply flipped it back and forth (the plan never converged)."""
    from actions.api_key import ensure_key
    from reconcile.spec.deployments import deployments

    key = tmp_path / "keys" / "api.key"
    path = tmp_path / "box.toml"
    tables = ""
    for n, (name, owner) in enumerate((("chat", "root"), ("draft", "nobody"))):
        tables += (
            f'[deployments.{name}.server]\nexecutable = "/bin/true"\nmodel = "/m"\nport = {18000 + n}\n'
            f'log = "{tmp_path}/{name}.log"\n\n[deployments.{name}.api_key]\nfile = "{key}"\n'
            f'owner = "{owner}"\n\n'
        )
    path.write_text(f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n{tables}')
    try:
        every = deployments(load_spec(str(path)))
    except SpecError as exc:
        assert "deployments.draft.api_key.file" in str(exc) and "chat" in str(exc), exc
        return
    for d in every:
        assert d.loaded.spec.api_key is not None
        ensure_key(d.loaded.spec.api_key)
    assert key.stat().st_uid == 0, "the key chat's server is started with is nobody's"


# --- class 4: the new color's port taken before a blue/green switch binds it ----------------------------


@ROOT_ONLY
@needs_haproxy
def test_a_blue_green_switch_never_moves_traffic_to_a_listener_that_took_the_new_colors_port(
    demo: Demo, strangers: list[int]
) -> None:
    """Already refused on main, kept as a new member (the switch's own port): blue serves behind the
    front; nobody binds green's loopback port and answers everything with 200 (a chat answer too);
    then a spec change asks for a blue/green switch. main (seen): the plan said nothing of green's port
    (its `host.port` rule looks at the serving color's), and the switch's `ensure_running` found
    nobody's process on green's port before launching anything ("port P is held by pid N (user nobody
    ...), which is not deployment ...-green"): the server row failed, apply rolled back by itself, blue
    kept serving through the front and nobody's listener got no request (the acceptance chat is
    guarded too). Since the colors serve on Unix sockets (round 17c, closed after it): green's old port
    is nothing of the deployment's, the switch moves traffic to green's socket and nobody's listener
    still gets nothing."""
    from tests.ownership_support import SPY, received
    from tests.switch_load_support import stop_front
    from tests.test_server_support import free_port
    from tests.test_switch_load import _spec

    ports = [free_port(), free_port()]
    _spec(demo, 8, ports)
    try:
        first = demo.cli("apply")
        assert first.returncode == 2 and "started haproxy" in first.output, first.output
        spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(ports[1])], {}, strangers)
        _spec(demo, 9, ports)
        run = demo.cli("apply")
        assert "internal error" not in run.output and "Traceback" not in run.output, run.output
        assert "traffic moved to green" in run.output, run.output
        assert _health(demo.port) == 200, run.output  # through the front: green serves
        assert received(spy) == "", "nobody's listener on green's port got a request"
    finally:
        stop_front(str(demo.spec_path))


# --- class 1: a deployment's server named as another deployment's color --------------------------------


def test_a_server_name_is_never_another_fronted_deployments_color(tmp_path: Path) -> None:
    """Behind the front, deployment chat's server runs as `chat-blue` and `chat-green`: their own
    pidfiles, records and, under `supervisor = "systemd"`, their own units, named by the server's name
    alone (`reconcile-chat-blue.service`, machine-wide). Deployment draft's server named `chat-blue`
    (systemd) is then the same unit: a switch of chat writes and starts draft's unit as its blue color,
    and draft's apply takes it back. main (seen): loaded (server names were held apart, colors not);
    the unit's fight itself read, not run (no systemd on this machine)."""
    path = tmp_path / "box.toml"
    tables = ""
    for n, (name, server, front) in enumerate((("chat", "chat", True), ("draft", "chat-blue", False))):
        tables += (
            f'[deployments.{name}.server]\nname = "{server}"\nexecutable = "/bin/true"\nmodel = "/m"\n'
            f'port = {18000 + 10 * n}\nsupervisor = "systemd"\nlog = "{tmp_path}/{name}.log"\n\n'
        )
        tables += f"[deployments.{name}.front]\n\n" if front else ""
    path.write_text(f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[front]\n\n{tables}')
    with pytest.raises(SpecError) as refused:
        load_spec(str(path))
    said = str(refused.value)
    assert "deployments.draft.server.name" in said and '"chat-blue" is deployment chat' in said, said


# --- class 6: a front that can never start, and says nothing of why -------------------------------------


@needs_haproxy
def test_a_state_dir_too_long_for_the_fronts_socket_is_named_with_its_fix(
    tmp_path: Path, front_of: list[Spec]
) -> None:
    """Not an attack of another user's: a careless value. HAProxy takes a Unix socket's path of at most
    97 bytes; the front's runtime socket lives in the state dir. main (seen): every apply failed with
    "haproxy -c refused the front's config: " and nothing after it (`-q` kept HAProxy's reason quiet),
    for good."""
    from reconcile.errors import ActionError

    state = tmp_path / ("s" * (100 - len(str(tmp_path))))
    with pytest.raises(ActionError) as refused:
        _front_started(_fronted(tmp_path, str(state)), front_of)
    said = str(refused.value)
    assert "[machine] state_dir" in said and "at most 97" in said, said


@ROOT_ONLY
def test_a_listener_beside_the_server_never_keeps_a_hung_engine_from_its_restart(
    live: Demo, strangers: list[int]
) -> None:
    """The engine is hung (its EngineCore stopped) and nobody listens on 127.0.0.2:PORT beside the
    server (no clash). main (seen): the apply's plan names nobody's process (`host.port`) and is
    blocked, and the liveness look sends nothing (the guard refuses a port with a foreign listener):
    the hung engine stays, for as long as nobody's listener does. Left open by the round as a strict
    xfail; closed after it: the guard and `host.port` count the listeners a connection to the server's
    host reaches, or that clash with its bind (reconcile.ownership.sockets.reaches)."""
    first = live.cli("apply")
    assert first.returncode == 2, first.output
    hung = server_pid(live)
    stop(engine_core(live))
    as_nobody(["/usr/bin/python3", "-c", BESIDE, str(live.port)], {}, strangers)
    run = live.cli("apply")
    assert server_pid(live) != hung, run.output
    assert _health(live.port) == 200, run.output


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from deployment_in(tmp_path)


@ROOT_ONLY
@pytest.mark.parametrize("address", ["0.0.0.0", "::", "::ffff:127.0.0.1"])
def test_a_listener_on_a_wildcard_or_mapped_address_of_the_port_never_gets_the_key(
    deployment: Deployment, strangers: list[int], address: str
) -> None:
    """Already refused on main (it counted every listener on the port), kept as the members the narrowed
    guard must still count: with the deployment's server (127.0.0.1:PORT) down, nobody listens on
    0.0.0.0:PORT, on [::]:PORT dual-stack (IPv4's connections too) or on ::ffff:127.0.0.1:PORT (IPv4's
    loopback through an IPv6 socket), each reached by a connection to 127.0.0.1:PORT. The unkeyed
    /health reaches it; the keyed requests are never sent, and the server row names it."""
    from probes import health, server
    from tests.ownership_support import SPY, received

    d, spec = deployment, deployment.spec()
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(d.port), address], {}, strangers)
    seen = health.probe(spec)
    check = health.chat_check(spec, timeout=5)
    listener = server.probe(spec).listener
    got = received(spy)
    assert "GET /health" in got  # the connection reached nobody's listener
    assert d.key not in got and "authorization" not in got.lower(), got
    assert not check.ok and f"pid {spy.pid}" in (seen.error or ""), seen
    assert (listener.state, listener.pid, listener.user) == ("foreign", spy.pid, "nobody")


@ROOT_ONLY
def test_an_ipv6_only_listener_on_the_wildcard_never_keeps_the_server_from_its_start(
    deployment: Deployment, strangers: list[int]
) -> None:
    """A member of the closed listener-beside class, on IPv6's wildcard: with the deployment (127.0.0.1)
    down, nobody listens on [::]:PORT with IPV6_V6ONLY, which no IPv4 connection reaches and whose bind
    does not clash with 127.0.0.1:PORT. main: the start is refused naming nobody's listener as the
    port's holder; now the server starts and answers."""
    from actions import server as server_action
    from tests.ownership_support import INPUTS

    spec = deployment.spec()
    as_nobody(["/usr/bin/python3", "-c", BESIDE, str(deployment.port), "::"], {}, strangers)
    server_action.ensure_running(spec, INPUTS)
    assert _health(deployment.port) == 200
