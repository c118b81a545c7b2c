"""Issue 24's network attacks, for real: a local user (`nobody`) listens on the spec's port and answers
reconcile's HTTP requests slowly, endlessly, or with terminal escape sequences; a server's log line
carries them too. `plan`, `status` and `apply` must end within their deadlines, in bounded memory, and
print none of the sequences (docs/security.md, "Network answers and output").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in, free_port
from tests.ownership_support import as_nobody, root_only

pytestmark = root_only

# A listener script's accept loop, one thread per connection (`serve(c)` and `port` are the script's).
ACCEPT_LOOP = """s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# The attacker: answers `target` ("*": every path) by `mode`, every other path as a healthy vLLM would.
HOSTILE = (
    r"""
import json, socket, sys, threading, time
port, mode, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ESC = json.loads(sys.argv[4]) if len(sys.argv) > 4 else ""
def normal(path):
    if path == "/health": return 200, b""
    if path == "/version": return 200, json.dumps({"version": "0.26.0"}).encode()
    if path == "/v1/models":
        return 200, json.dumps({"object": "list", "data": [{"id": "x", "max_model_len": 2048}]}).encode()
    if path == "/metrics": return 200, b"vllm:num_requests_running 0\n"
    return 404, b"{}"
def attack(c, path):
    if mode == "drip":  # a status line, then one header that never ends, a byte every 2 s
        for b in b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 10**6:
            c.sendall(bytes([b]))
            time.sleep(2)
    elif mode in ("endless", "chunked", "length"):
        head = {"endless": b"", "chunked": b"Transfer-Encoding: chunked\r\n",
                "length": b"Content-Length: 1099511627776\r\n"}[mode]
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head + b"\r\n")
        block = b"A" * 65536
        if mode == "chunked":
            block = b"10000\r\n" + block + b"\r\n"
        while True:
            c.sendall(block)
    elif mode == "escapes":
        data = {"/version": {"version": "0.26.0" + ESC},
                "/v1/chat/completions": {"choices": [{"message": {"content": "Paris" + ESC}}]},
                "/v1/models": {"object": "list",
                               "data": [{"id": "m" + ESC, "root": "r" + ESC, "max_model_len": 2048}]}}
        body = json.dumps(data.get(path, {})).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
def serve(c):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = [int(h.split(b":")[1]) for h in lines if h.startswith(b"content-length:")]
        while length and len(body) < length[0]:
            body += c.recv(65536)
        path = data.split(b" ", 2)[1].decode()
        if target in ("*", path):
            attack(c, path)
        else:
            status, body = normal(path)
            c.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body)
    except OSError:
        pass
    finally:
        c.close()
"""
    + ACCEPT_LOOP
)

# An OSC window title (with BEL), clear screen, a cursor move, a C1 CSI, a line separator, and a newline
# that would start a line of its own in the plan.
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[5;5H\x9b31m\u2028\n  ✓ server forged"
RAW = ("\x1b", "\x07", "\x9b", "\u2028")
MIB = 1024
RSS_KILL_KIB = 512 * MIB
ROOT = (
    Path(__file__).resolve().parent.parent
)  # the old client passed this within a second or two of an endless body


@dataclass
class Watched:
    returncode: int | None  # None: killed (too slow, or too large)
    output: str
    seconds: float
    peak_rss_kib: int


def watched(demo: Demo, *args: str, wall: float = 60) -> Watched:
    """The CLI, stopped (whole process group) past `wall` seconds or RSS_KILL_KIB: how long it ran, its
    peak RSS as the kernel's high-water mark of its own memory (VmHWM, read every 50 ms). Not wait4's
    ru_maxrss: Linux keeps the forking parent's mark across exec, so in a long pytest run every child
    "peaked" at pytest's own size (357 MiB seen in the full suite)."""
    return watch(demo.command(*args), demo.env(), str(demo.root), wall)


def watch(argv: list[str], env: dict[str, str], cwd: str, wall: float) -> Watched:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )
    chunks: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    started, seen, killed = time.monotonic(), 0, False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            text = Path(f"/proc/{proc.pid}/status").read_text()
            seen = max(seen, int(re.search(r"VmHWM:\s+(\d+)", text).group(1)))  # type: ignore[union-attr]
        except (OSError, AttributeError):
            pass
        if not killed and (time.monotonic() - started > wall or seen > RSS_KILL_KIB):
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    reader.join(10)
    output = b"".join(chunks).decode("utf-8", "replace")
    del usage  # see the docstring
    return Watched(None if killed else proc.returncode, output, seconds, seen)


@pytest.fixture
def demo(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    from tests.apply_support import seed_venv

    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def attacker(demo: Demo, strangers: list[int], mode: str, target: str, escapes: str = "") -> None:
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), mode, target, json.dumps(escapes)]
    as_nobody(argv, {}, strangers)


def with_health_timeout(demo: Demo, seconds: int) -> None:
    def edit(doc: Any) -> None:
        doc["health"] = {"timeout": f"{seconds}s"}

    demo.write_spec(edit)


# --- 4. bounded network reads ---------------------------------------------------------------------


def test_a_listener_that_drips_health_cannot_hold_plan_or_apply(demo: Demo, strangers: list[int]) -> None:
    """Seen before: plan and apply waited forever (each byte came within the per-read timeout)."""
    attacker(demo, strangers, "drip", "/health")
    plan = watched(demo, "plan")
    assert plan.returncode == 1, plan.output  # host.port: the port is held
    assert plan.seconds < 15, plan
    said = f"http://127.0.0.1:{demo.port}/health: no complete answer within 5 s (slow or stuck listener)"
    assert said in plan.output and "of user nobody" in plan.output, plan.output
    with_health_timeout(demo, 2)
    apply = watched(demo, "apply")
    assert apply.returncode == 1 and apply.seconds < 15, apply  # ends (and lets the lock go) in time
    assert "within 2 s (slow or stuck listener)" in apply.output, apply.output


@pytest.mark.parametrize(
    ("mode", "path"),
    [("endless", "/health"), ("chunked", "/health"), ("length", "/health"), ("endless", "/version")],
)
def test_an_endless_answer_is_refused_at_the_cap_in_bounded_memory(
    demo: Demo, strangers: list[int], mode: str, path: str
) -> None:
    """Seen before: an endless /health body took `plan` past 1 GiB of RSS in about two seconds."""
    attacker(demo, strangers, mode, path)
    run = watched(demo, "status")
    assert run.returncode is not None and run.seconds < 20, run
    assert run.peak_rss_kib < 200 * MIB, run.peak_rss_kib
    declared = " (Content-Length: 1099511627776)" if mode == "length" else ""
    said = f"http://127.0.0.1:{demo.port}{path}: answer larger than 1 MiB{declared}: refused"
    assert said in run.output, run.output


def test_an_endless_metrics_answer_is_refused_at_its_cap(demo: Demo, strangers: list[int]) -> None:
    """`status` no longer reads /metrics from a listener that is not the deployment's (the fifth hostile
    round: tests/test_hostile_reader5b.py); the cap itself is http_request's, read here directly."""
    from reconcile.host import HttpTooLarge, http_request

    attacker(demo, strangers, "endless", "/metrics")
    run = watched(demo, "status")
    assert run.returncode is not None and run.seconds < 20, run
    assert run.peak_rss_kib < 200 * MIB, run.peak_rss_kib
    assert "answer larger" not in run.output, run.output  # not read at all: the port is not ours
    with pytest.raises(HttpTooLarge, match=r"/metrics: answer larger than 16 MiB: refused"):
        http_request("GET", "127.0.0.1", demo.port, "/metrics", timeout=20, limit=16 << 20)


# The plan's hub listing (probes.hub: the model is not on disk yet) against a hostile HF_ENDPOINT.
LISTING = """
import sys, tempfile
from probes import hub
hub.DEADLINE_S = float(sys.argv[2])
print(hub.listing("org/x", "main", tempfile.mkdtemp(), offline=False, endpoint=sys.argv[1]))
"""


@pytest.mark.parametrize("mode", ["drip", "endless", "chunked", "length"])
def test_a_hostile_hub_mirror_cannot_hold_the_listing_or_fill_memory(
    tmp_path: Path, strangers: list[int], mode: str
) -> None:
    """Seen before: a dripping mirror held the listing (and so the plan) past 40 s (huggingface_hub's
    timeout is per read); an endless listing took it to 1 GiB in 3 s."""
    port = free_port()
    as_nobody(["/usr/bin/python3", "-c", HOSTILE, str(port), mode, "*"], {}, strangers)
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = watch([sys.executable, "-c", LISTING, endpoint, "3"], env, str(tmp_path), wall=40)
    assert run.returncode == 0 and run.seconds < 15, run
    assert run.peak_rss_kib < 200 * MIB, run.peak_rss_kib
    if mode == "drip":
        assert f"{endpoint}: no complete answer within 3 s (slow or stuck hub)" in run.output, run.output
    else:
        assert "/api/models/org/x/revision/main: answer larger than 16 MiB" in run.output, run.output


# --- 5. output is data, not control -----------------------------------------------------------------


def assert_no_raw_escapes(text: str) -> None:
    for raw in RAW:
        assert raw not in text, (raw, text)
    assert not any(line.startswith("  ✓ server forged") for line in text.splitlines()), text


def test_escape_sequences_in_version_and_model_ids_never_reach_the_terminal(
    demo: Demo, strangers: list[int]
) -> None:
    """Seen before: `status` printed /version's and /v1/models' escapes raw (a retitled, cleared terminal)."""
    attacker(demo, strangers, "escapes", "*", ESCAPES)
    for command in ("check", "status", "plan"):
        run = watched(demo, command)
        assert run.returncode is not None, run
        assert_no_raw_escapes(run.output)
    check = watched(demo, "check").output
    # A listener that is not the deployment's is never vouched for, so its chat answer is not shown
    # at all (tests/test_hostile_reader3.py); what check does print of it is escaped above.
    assert "cannot verify the server" in check and "Paris" not in check, check
    status = watched(demo, "status").output
    assert "vLLM 0.26.0\\u001b]0;pwned\\u0007\\u001b[2J\\u001b[5;5H\\u009b31m\\u2028\\n" in status, status
    data = json.loads(watched(demo, "status", "--json").output)
    assert data["server"]["version"].startswith("0.26.0\\u001b]0;pwned\\u0007")  # escaped as it came in


def test_escape_sequences_in_a_failed_start_log_line_never_reach_the_terminal(demo: Demo) -> None:
    line = "ValueError: no attention backend " + ESCAPES.split("\n")[0]  # a newline: the log's next line

    def edit(doc: Any) -> None:
        doc["server"]["env"]["FAKE_VLLM_FAIL_WITH_HEX"] = line.encode().hex()

    demo.write_spec(edit)
    run = watched(demo, "apply", wall=120)
    assert run.returncode == 4, run.output  # not converged: the server did not start
    assert_no_raw_escapes(run.output)
    assert "no attention backend \\u001b]0;pwned" in run.output, run.output
