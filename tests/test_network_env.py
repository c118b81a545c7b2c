"""Network locations in the environment and the spec (issue 24, class 4; docs/security.md, "Network
locations in the environment"): a URL (or a proxy's host:port) whose host is this machine names a
listener, and a local user can bind an unprivileged port before root connects to it. Each attack is
run for real: `nobody` listens on loopback (a PEP 503 index with a real wheel, a proxy that records
what it is sent) and root runs the real CLI, pip and uv.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, Run
from tests.ownership_support import SPY, as_nobody, listening_as_nobody, received
from tests.test_hostile_reader8 import nobodys_index
from tests.test_server_support import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's listener)")

# An HTTP server on loopback port argv[1] serving directory argv[2] (nobody's PEP 503 index).
INDEX = r"""
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler)
print("ready", flush=True)
server.serve_forever()
"""


def _nobodys_index(outside: Path, strangers: list[int]) -> tuple[int, Path]:
    """nobody's index (round 8's ninja 99.0, whose `.pth` writes a marker when the venv's python starts)
    served by nobody on a free loopback port. Returns (port, marker)."""
    theirs, marker = nobodys_index(outside)
    port = free_port()
    as_nobody(["/usr/bin/python3", "-c", INDEX, str(port), str(theirs)], {}, strangers)
    return port, marker


def _ran(demo: Demo, marker: Path) -> tuple[list[Path], str]:
    installed = list(demo.venv.glob("lib/python3*/site-packages/ninja-99.0.dist-info"))
    return installed, marker.read_text() if marker.exists() else ""


@pytest.mark.parametrize(
    ("name", "host"),
    [
        ("PIP_INDEX_URL", "127.0.0.1"),
        ("UV_INDEX_URL", "127.0.0.1"),
        ("UV_INDEX_URL", "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54"),  # fullwidth "localhost"
        ("UV_INDEX_URL", "\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff11"),  # fullwidth 127.0.0.1
    ],
    ids=["pip", "uv", "uv-fullwidth-name", "uv-fullwidth-address"],
)
def test_an_index_nobody_listens_on_never_hands_root_their_wheel(
    demo: Demo, outside: Path, strangers: list[int], name: str, host: str
) -> None:
    """`sudo -E reconcile apply` with PIP_INDEX_URL (pip) or UV_INDEX_URL (uv, reconcile's own
    dependency, found on PATH) naming a loopback port: the environment rule looked for paths, and a
    URL of http://127.0.0.1:PORT names none. nobody bound the port first and serves a PEP 503 index.
    main: root's venv got nobody's ninja 99.0, whose `.pth` ran as uid 0 at the venv python's next
    start (pip and uv alike). uv maps a host as IDNA's UTS 46 does (fullwidth letters and digits, the
    ideographic full stop U+3002): the listener rule's first cut compared the host as written, and uv
    reached nobody's index through `http://ｌｏｃａｌｈｏｓｔ:PORT` and `http://１２７。０。０。１:PORT`."""
    run = applied_with_nobodys_index(demo, outside, strangers, name, f"http://{host}:PORT/simple")
    assert "listened on by nobody (uid 65534)" in run.output, run.output


def applied_with_nobodys_index(demo: Demo, outside: Path, strangers: list[int], name: str, value: str) -> Run:
    """`apply` with the environment's `name` = `value`, PORT in it nobody's index's port (uv, from
    reconcile's own venv, on PATH for a UV_ name): root installed nothing of nobody's, and the variable
    was left out with its line. Returns the run."""
    port, marker = _nobodys_index(outside, strangers)
    value = value.replace("PORT", str(port))
    env = {name: value}
    if name.startswith("UV_"):  # uv from reconcile's own venv: the "auto" installer then takes it
        env["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    run = demo.cli("apply", env=env, timeout=300)
    installed, ran = _ran(demo, marker)
    assert not installed and not ran, f"root installed nobody's wheel ({ran!r} ran): {run.output}"
    assert f"reconcile: environment {name} left out: {value}: port {port} on " in run.output, run.output
    assert "Traceback" not in run.output, run.output
    return run


PASSWORD = "s3cret-index-token"


@pytest.fixture
def roots_index(tmp_path: Path) -> Iterator[int]:
    """root's own (empty) index on loopback: a port root listens on, in this process."""
    served = tmp_path / "served"
    (served / "simple" / "ninja").mkdir(parents=True)
    (served / "simple" / "ninja" / "index.html").write_text("<html><body></body></html>\n")

    class Quiet(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_proxy_nobody_listens_on_never_receives_roots_index_credentials(
    demo: Demo, strangers: list[int], roots_index: int
) -> None:
    """The spec's index is root's own listener and its password goes to pip through a private netrc
    (never on a command line). `http_proxy` in the environment (sudo -E keeps it) names a loopback
    port nobody listens on: pip sends every request there, the password with it. main: nobody's
    proxy received `Authorization: Basic` with the index's password."""
    spy_port = free_port()
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(spy_port)], {}, strangers)
    index = f"http://reconcile:{PASSWORD}@127.0.0.1:{roots_index}/simple"

    def edit(doc: Any) -> None:
        doc["venv"]["index_url"] = index

    proxy = f"http://127.0.0.1:{spy_port}"
    env = {"http_proxy": proxy, "no_proxy": "", "NO_PROXY": ""}
    run = demo.cli("apply", spec=demo.write_spec(edit), env=env, timeout=300)
    seen = received(spy)
    secret = base64.b64encode(f"reconcile:{PASSWORD}".encode()).decode()
    assert PASSWORD not in seen and secret not in seen, f"nobody's proxy got the password: {seen}"
    assert f"reconcile: environment http_proxy left out: {proxy}: port {spy_port}" in run.output, run.output
    assert "Traceback" not in run.output, run.output


# (variable, value with PORT for nobody's port, the host nobody listens on)
FORMS = [
    ("HF_ENDPOINT", "http://localhost:PORT", "127.0.0.1"),
    ("HF_ENDPOINT", f"http://{socket.gethostname()}:PORT/", "127.0.0.1"),
    ("PIP_EXTRA_INDEX_URL", "https://mirror.example/simple http://127.1:PORT/simple", "127.0.0.1"),
    ("UV_EXTRA_INDEX_URL", "http://user:pw@[::1]:PORT/simple", "::1"),
    ("HTTPS_PROXY", "127.0.0.1:PORT", "127.0.0.1"),
    ("ALL_PROXY", "socks5h://LOCALHOST.:PORT", "127.0.0.1"),
    ("VLLM_SOMETHING_URL", "http://vm.localhost:PORT", "127.0.0.1"),
    ("UV_INDEX_URL", "http://%6Cocalhost:PORT/simple", "127.0.0.1"),
    ("https_proxy", "http://0.0.0.0:PORT", "0.0.0.0"),
]


@pytest.mark.parametrize(("name", "value", "host"), FORMS)
def test_every_form_of_a_local_network_location_is_held_to_the_listener_rule(
    demo: Demo, strangers: list[int], name: str, value: str, host: str
) -> None:
    """New members of the class, each a way to write this machine: a name (`localhost`, the hostname,
    a trailing dot, any case, a `.localhost` name, percent-escaped: uv decodes it, seen), inet_aton's
    short form `127.1`, IPv6 `[::1]`, the wildcard address, credentials in the URL, a proxy's bare
    host:port, one URL of a list, a variable no tool's namespace holds. nobody listens on each.
    main: all kept (no line)."""
    port = listening_as_nobody(strangers, host)
    value = value.replace("PORT", str(port))
    run = demo.cli("plan", env={name: value})
    assert f"reconcile: environment {name} left out: {value}: port {port} on" in run.output, run.output
    assert "listened on by nobody (uid 65534)" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_local_port_nothing_listens_on_is_left_out_unless_only_root_can_bind_it(demo: Demo) -> None:
    """Nothing listens on an unprivileged port: anyone may bind it after the check, so the variable is
    left out. A port below ip_unprivileged_port_start (the tests' `http://127.0.0.1:9`, "nothing
    listens: fails at once"), a remote host and root's own listener are kept (no line)."""
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen(1)
        roots = mine.getsockname()[1]
        free = free_port()
        env = {
            "PIP_INDEX_URL": f"http://127.0.0.1:{free}/simple",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HF_ENDPOINT": "https://huggingface.example",
            "UV_INDEX_URL": f"http://localhost:{roots}/simple",
        }
        run = demo.cli("plan", env=env)
    said = f"reconcile: environment PIP_INDEX_URL left out: {env['PIP_INDEX_URL']}: nothing listens on port"
    assert said in run.output, run.output
    assert "anyone may bind it" in run.output, run.output
    for kept in ("HTTP_PROXY", "HF_ENDPOINT", "UV_INDEX_URL"):
        assert f"environment {kept} left out" not in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_spec_index_nobody_listens_on_is_a_plan_error_naming_the_key(
    demo: Demo, outside: Path, strangers: list[int]
) -> None:
    """`[venv] index_url` naming a loopback port: the index role held a local path (file://) to the
    read role and took a URL as the spec's choice, whoever listened there. main: an unlocked apply
    installed nobody's ninja 99.0, whose `.pth` ran as uid 0."""
    port, marker = _nobodys_index(outside, strangers)
    url = f"http://127.0.0.1:{port}/simple"

    def edit(doc: Any) -> None:
        doc["venv"]["index_url"] = url

    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300)
    installed, ran = _ran(demo, marker)
    assert not installed and not ran, f"root installed nobody's wheel ({ran!r} ran): {run.output}"
    assert f"[venv].index_url {url}: port {port} on 127.0.0.1 is listened on by nobody" in run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_a_hub_endpoint_nobody_listens_on_in_the_servers_environment_fails_the_plan(
    demo: Demo, strangers: list[int]
) -> None:
    """`[server] env HF_ENDPOINT` (the server downloads the model's files from there, as root by
    default) naming a loopback port nobody listens on. main: planned without a word."""
    port = listening_as_nobody(strangers)
    url = f"http://127.0.0.1:{port}"

    def edit(doc: Any) -> None:
        doc["server"]["env"]["HF_ENDPOINT"] = url

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert f"[server].env.HF_ENDPOINT {url}: port {port} on 127.0.0.1 is listened on by nobody" in run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output
