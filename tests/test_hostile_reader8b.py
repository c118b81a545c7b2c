"""Issue 24's hostile reader, eighth round, classes 4-6 (bounded network reads, output is data, state
never wedges) and the process-ownership rules: attacks on what the seventh round added (the state
shapes' TIME and PID ranges, `display.shown_argv`) and on what no round attacked yet, found by reading
docs/security.md and the code alone, each run for real (a listener of `nobody` on the port, real damaged
state files, real processes), each seen succeeding on main before its fix unless its docstring says it
was already refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in
from tests.ownership_support import NOBODY, as_nobody, nobodys_dir
from tests.test_network_attacks import ACCEPT_LOOP, HOSTILE, watched

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")

# A lone surrogate, as a JSON `\ud800` escape decodes to: a str Python holds but no UTF-8 stream can
# write ("surrogates not allowed"), whatever the locale's error handler (surrogateescape takes only
# U+DC80-U+DCFF). And one of that range, which surrogateescape writes as the raw byte 0x9b: an 8-bit
# terminal's CSI, and never UTF-8.
LONE = "\ud800"
RAW_BYTE = "\udc9b"


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def _utf8_without_raw(out: bytes) -> str:
    """The output as text: it must be UTF-8 (no raw byte a surrogate escaped to), without a surrogate."""
    text = out.decode("utf-8")  # raises on a raw 0x9b or 0xed 0xa0 0x80
    assert "\ud800" not in text and "\x9b" not in text, text[-2000:]
    return text


@ROOT_ONLY
def test_a_lone_surrogate_in_a_listeners_version_is_shown_escaped_not_a_crash(
    demo: Demo, strangers: list[int]
) -> None:
    """`nobody` listens on the deployment's port (the server is down) and answers `/version` (read
    unguarded: the plan's server row names a foreign holder from the port itself) with
    `{"version": "0.26.0\\ud800"}`: valid JSON, which Python decodes to a lone surrogate. main: every
    `status` ended in `internal error: UnicodeEncodeError: 'utf-8' codec can't encode character
    '\\ud800' ... surrogates not allowed` when SafeStream wrote the version (seen on main), and the same
    with `\\udc9b` wrote a raw 0x9b byte to the terminal under the C locale's surrogateescape. Now a
    surrogate is a control character to `shown()` and SafeStream: written as its escape `\\ud800`."""
    for lone in (LONE, RAW_BYTE):
        argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps(lone)]
        listener = as_nobody(argv, {}, strangers)
        for command in (("status",), ("status", "--json"), ("plan",)):
            run = subprocess.run(
                demo.command(*command), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=120
            )
            text = _utf8_without_raw(run.stdout + run.stderr)
            assert "internal error" not in text, (command, text[-2000:])
            assert run.returncode in (1, 2), (command, run.returncode, text[-2000:])
            if command == ("status",):
                assert "0.26.0" + json.dumps(lone)[1:-1] in text, text[-2000:]
            if command == ("status", "--json"):
                json.loads(run.stdout)  # the escape SafeStream writes is JSON's own
        listener.kill()
        listener.wait()


@pytest.mark.parametrize("command", [("status",), ("plan",), ("apply", "--scheduled"), ("resume",)])
def test_a_lone_surrogate_in_a_pause_reason_never_wedges_the_machine(
    demo: Demo, command: tuple[str, ...]
) -> None:
    """`paused.json` whose reason holds a `\\ud800` escape and, apart (not a pair), a `\\udc9b` (a
    damaged file, or a reason given as `reconcile pause --reason` bytes a terminal sent): it passes the
    shape (a string), and every run shows it. main: `status`, `plan`, the timer's `apply --scheduled`
    and `resume` each ended in `internal error: UnicodeEncodeError ... surrogates not allowed`, for
    good, until a person removed the file (seen on main). Now it is shown escaped; the pause holds
    and `resume` lifts it."""
    demo.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = {"reason": f"maintenance {LONE} {RAW_BYTE}", "user": "root", "pid": 1, "since": 1_000_000_000}
    (demo.state_dir / "paused.json").write_text(json.dumps(body))
    run = subprocess.run(
        demo.command(*command), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=120
    )
    text = _utf8_without_raw(run.stdout + run.stderr)
    assert "internal error" not in text, text[-2000:]
    if command != ("resume",):
        assert "maintenance \\ud800 \\udc9b" in text, text[-2000:]
    if command == ("apply", "--scheduled"):
        assert run.returncode == 0 and "paused" in text, text[-2000:]  # the pause holds
    if command == ("resume",):
        assert run.returncode == 0 and not (demo.state_dir / "paused.json").exists(), text


AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@ROOT_ONLY
@pytest.mark.parametrize("pid", ["4294967296", "99999999999999999999"])
def test_a_temp_name_the_key_owner_makes_up_never_wedges_apply(demo: Demo, yard: Path, pid: str) -> None:
    """The key's `owner` may own the key's directory (docs/security.md: the write role allows it), and
    apply sweeps that directory for the key's temp files a killed apply left (`.api.key.reconcile-
    <pid>-XXXXXXXX.tmp`), removing those whose writer's pid is not running. `nobody`, as the key's
    owner, names an empty file there with a pid past 2**31. main: `os.kill(pid, 0)` raised
    OverflowError and every apply, the timer's too, ended in `internal error: OverflowError: signed
    integer is greater than maximum` (seen on main). Now a pid no process can have (outside 1 to
    pid_max, `shapes.is_pid`) is a writer that is gone: the file is swept and apply goes on."""

    keys = nobodys_dir(yard, "keys")

    def edit(doc: Any) -> None:
        doc["api_key"]["file"] = str(keys / "api.key")
        doc["api_key"]["owner"] = "nobody"

    demo.write_spec(edit)
    planted = keys / f".api.key.reconcile-{pid}-abcdefgh.tmp"
    subprocess.run([*AS_NOBODY, "touch", str(planted)], check=True)
    for command in (("apply",), ("apply", "--scheduled")):
        run = demo.cli(*command)
        assert "internal error" not in run.output, (command, run.output[-2000:])
        assert run.returncode in (0, 2), (command, run.output[-2000:])
    assert not planted.exists()
    assert (keys / "api.key").stat().st_uid == 65534  # the key apply made, for its owner


# --- process ownership ----------------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36
needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy")


def _take_pid(pid: int, strangers: list[int]) -> subprocess.Popen[bytes] | None:
    """A process of nobody's with pid `pid`, once that pid is free (ns_last_pid, as a local user who
    forks through the pid space would get it); None when another process took it first."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    proc = subprocess.Popen(["/bin/sleep", "120"], user=NOBODY, group=NOBODY, extra_groups=[])
    strangers.append(proc.pid)
    return proc if proc.pid == pid else None


@ROOT_ONLY
@needs_haproxy
def test_the_fronts_stop_never_signals_a_process_that_took_the_masters_pid(
    tmp_path: Path, strangers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HAProxy's master (the front, [front]) is stopped by `actions.haproxy.stop`. It is proven ours
    once (`front_master`: root, haproxy's exe, our config on its command line), then signalled by bare
    pid: SIGTERM, a wait while `/proc/PID` is a live process, then SIGKILL to PID where no cgroup of
    ours holds it (a machine without cgroup v2 delegation). The master exits on the SIGTERM and PID 1
    reaps it at once; `nobody`, forking through the pid space, takes its pid within the wait's 50 ms
    sleep. main: the wait saw nobody's live process for the whole timeout, then SIGKILLed it (seen on
    main, 3 runs of 3). Now the master is pinned by a pidfd once proven, and the signals and the wait
    act on that process alone (`actions.supervising.Pinned`, as the deployment's members are)."""
    from actions import haproxy
    from reconcile.ownership import cgroups
    from reconcile.spec.loader import load_spec
    from tests.apply_support import free_port

    monkeypatch.setattr(cgroups, "cgroup_root", lambda: (None, "forced off by the test"))
    port, blue, green = free_port(), free_port(), free_port()
    spec_path = tmp_path / "box.toml"
    spec_path.write_text(
        f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[server]\nname = "d"\nexecutable = "/bin/true"\n'
        f'model = "/m"\nport = {port}\nlog = "{tmp_path / "d.log"}"\n\n[front]\nports = [{blue}, {green}]\n'
    )
    spec = load_spec(str(spec_path)).spec
    haproxy.write_config(spec, haproxy.render(spec, "blue"))
    libc = ctypes.CDLL(None, use_errno=True)
    for _attempt in range(3):  # another process may take the freed pid first: the machine forks
        # The daemon's parent is then this process, which reaps it at once, as systemd (PID 1) does on
        # a real machine; a container's init may leave the zombie for a while, which hides the race.
        assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        try:
            master = haproxy.start(spec)
        finally:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        taken: list[subprocess.Popen[bytes]] = []
        reaped: list[int] = []

        def take_over(master: int = master, taken: list[Any] = taken, reaped: list[int] = reaped) -> None:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                if os.waitpid(master, os.WNOHANG)[0] == master:  # reaped, as PID 1 does
                    reaped.append(master)
                    got = _take_pid(master, strangers)  # and nobody's fork gets the pid
                    if got is not None:
                        taken.append(got)
                    return
                time.sleep(0.001)

        thief = threading.Thread(target=take_over)
        thief.start()
        try:
            haproxy.stop(spec, master, timeout=3.0)
        finally:
            thief.join()
        assert reaped, f"stop() did not stop haproxy's master {master}"
        if taken:
            break
    else:
        pytest.skip("each freed pid was taken by another process first (the machine forks)")
    with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL sent by stop() ends it within this
        taken[0].wait(timeout=2)


# --- 6. the state shapes' TIME and PID ranges (round 7), every other odd shape ---------------------

_PAUSE = '{{"reason": {reason}, "user": "root", "pid": {pid}, "since": {since}}}'
ODD_STATE = {
    # name: (file, text)
    "pause-nested-100000": ("paused.json", "[" * 100_000 + "]" * 100_000),
    "pause-int-5000-digits": ("paused.json", _PAUSE.format(reason='"x"', pid=1, since="9" * 5000)),
    "pause-int-4000-digits": ("paused.json", _PAUSE.format(reason='"x"', pid="9" * 4000, since=1)),
    "pause-pid-true": ("paused.json", _PAUSE.format(reason='"x"', pid="true", since=1)),
    "pause-pid-float": ("paused.json", _PAUSE.format(reason='"x"', pid="1.0", since=1)),
    "pause-pid-minus-zero": ("paused.json", _PAUSE.format(reason='"x"', pid="-0", since=1)),
    "pause-pid-minus-one": ("paused.json", _PAUSE.format(reason='"x"', pid="-1", since=1)),
    "pause-pid-2-to-the-31": ("paused.json", _PAUSE.format(reason='"x"', pid=2**31, since=1)),
    "pause-since-minus-zero": ("paused.json", _PAUSE.format(reason='"x"', pid=1, since="-0.0")),
    "pause-since-nan": ("paused.json", _PAUSE.format(reason='"x"', pid=1, since="NaN")),
    "pause-duplicate-keys": (
        "paused.json",
        '{"reason": "x", "reason": 7, "user": "root", "pid": 1, "since": 1}',
    ),
    "pause-nul-and-c1": (
        "paused.json",
        _PAUSE.format(reason='"a\\u0000b\\u009b31mc\\u2028d"', pid=1, since=1),
    ),
    "conditions-nested": ("conditions.json", '{"server": ' + "[" * 50_000 + "]" * 50_000 + "}"),
    "conditions-since-true": ("conditions.json", '{"server": {"status": "drift", "since": true}}'),
    "conditions-lone-surrogate-key": (
        "conditions.json",
        '{"server\\ud800": {"status": "drift", "since": 1}}',
    ),
    "last-run-huge-int": (
        "last-run.json",
        '{"format": "reconcile-last-run/1", "exit_code": ' + "9" * 4000 + "}",
    ),
    "last-run-counter-true": (
        "last-run.json",
        '{"format": "reconcile-last-run/1", "counters": {"changes_total": {"changed": true}, '
        '"runs_total": {}}}',
    ),
    "lock-holder-huge-pid": ("apply.lock", '{"pid": ' + "9" * 30 + ', "started": 1, "command": "x"}'),
}


@pytest.mark.parametrize("case", sorted(ODD_STATE))
def test_a_state_file_of_any_odd_shape_never_wedges_a_run(demo: Demo, case: str, tmp_path: Path) -> None:
    """Round 7 put TIME and PID ranges on the state shapes. Each other odd shape a damaged file can
    take, tried on the files every run reads (the pause, the conditions, last-run.json, the lock's
    holder text): nesting 100,000 deep, an integer of 5,000 digits (Python 3.11's JSON parser refuses
    more than 4,300: ValueError) and of 4,000 (parsed), `true`, `1.0`, `-0`, `-1` and 2**31 as a pid,
    `-0.0` and `NaN` as a time, duplicate keys, NUL, C1 and U+2028 in a string, a lone surrogate in a
    key. Already refused on main (kept as the rule's test): each run ends with its usual exit code and
    no internal error; what is not the file's shape is moved aside."""
    name, text = ODD_STATE[case]
    demo.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (demo.state_dir / name).write_text(text)
    textfile = tmp_path / "metrics.prom"
    for command in (
        ("status",),
        ("plan", "--scheduled", "--textfile", str(textfile)),
        ("apply", "--scheduled"),
    ):
        run = subprocess.run(
            demo.command(*command), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=180
        )
        out = _utf8_without_raw(run.stdout + run.stderr)
        assert "internal error" not in out and "Traceback" not in out, (command, out[-2000:])
        assert run.returncode in (0, 2, 4), (command, run.returncode, out[-2000:])
        assert "\x00" not in out and "\u2028" not in out, out[-2000:]


# --- 4. bounded network reads: what rounds 1-7 did not send -----------------------------------------

# Answers `target` by `mode` ("*": every path), every other path as a healthy vLLM would.
ODD_LISTENER = (
    r"""
import json, socket, sys, threading, zlib
port, mode, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def bomb():  # gzip of 512 MiB of zeros: 0.5 MiB on the wire, under the 1 MiB body cap
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block, out = bytes(1 << 20), []
    for _ in range(512):
        out.append(z.compress(block))
    out.append(z.flush())
    return b"".join(out)
BOMB = bomb() if mode == "gzip" else b""
def normal(path):
    if path == "/health": return b""
    if path == "/version": return json.dumps({"version": "0.26.0"}).encode()
    return b"{}"
def attack(c, path):
    if mode == "continue":  # interim answers, for ever
        while True:
            c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" * 1000)
    elif mode == "headers":  # a header block that never ends, at full speed
        c.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            c.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    elif mode == "chunk-line":  # a chunk-size line that never ends
        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            c.sendall(b"f" * 65536)
    elif mode == "chunk-huge":  # a chunk size of 2**4000 - 1, then data for ever
        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 1000 + b"\r\n")
        while True:
            c.sendall(b"A" * 65536)
    elif mode == "redirect":  # to a root-only file, and to another port
        where = b"file:///etc/shadow" if path != "/version" else b"http://127.0.0.1:9/x"
        c.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + where + b"\r\nContent-Length: 0\r\n\r\n")
    elif mode == "gzip":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(BOMB) + BOMB)
def serve(c):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                return
            data += chunk
        path = data.split(b" ", 2)[1].decode()
        if target in ("*", path):
            attack(c, path)
        else:
            body = normal(path)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    finally:
        c.close()
"""
    + ACCEPT_LOOP
)


@ROOT_ONLY
@pytest.mark.parametrize("target", ["/health", "/version"])
@pytest.mark.parametrize("mode", ["continue", "headers", "chunk-line", "chunk-huge", "redirect", "gzip"])
def test_a_listener_that_answers_oddly_is_cut_off_within_the_deadline_in_bounded_memory(
    demo: Demo, strangers: list[int], mode: str, target: str
) -> None:
    """`nobody` on the deployment's port (the server is down) answers `/health` or `/version` with
    interim `100 Continue` answers for ever, a header block that never ends, a chunk-size line that
    never ends, a chunk size of 2**4000 - 1 then data for ever, a redirect (to `file:///etc/shadow`,
    to another port), or `Content-Encoding: gzip` of 512 MiB of zeros (0.5 MiB on the wire, under the
    body cap). Already refused on main (kept as the rule's test): `http_request` asks for `identity`
    and inflates nothing, follows no redirect, takes a 100 as the answer's status, and holds every
    other case to its caps (64 KiB of head, 1 MiB of body, a chunk-size line's length) within the
    total deadline."""
    from tests.test_network_attacks import MIB

    as_nobody(["/usr/bin/python3", "-c", ODD_LISTENER, str(demo.port), mode, target], {}, strangers)
    for command in (("status",), ("plan",)):
        run = watched(demo, *command)
        assert run.returncode in (1, 2), (command, run)  # ended by itself: neither killed nor crashed
        assert run.seconds < 30, (command, run.seconds)
        assert run.peak_rss_kib < 200 * MIB, (command, run.peak_rss_kib)
        assert "internal error" not in run.output and "root:" not in run.output, run.output[-2000:]


# The deployment's own server, misbehaving (docs/security.md counts "a server that misbehaves (its
# answers, its log)" among the hostile): a process carrying the deployment's marker (as every process
# reconcile launches does) on its port, whose engine does not answer the 1-token completion and whose
# /metrics holds one sample line of 300,000 labels (3.5 MB, within the 16 MiB cap).
MISBEHAVING = (
    r"""
import socket, sys, threading, time
port = int(sys.argv[1])
LINE = b"vllm:num_requests_running{" + b",".join(b'l%d="v"' % i for i in range(300000)) + b"} 1\n"
METRICS = b"vllm:generation_tokens_total 5\n" + LINE
def serve(c):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                return
            data += chunk
        path = data.split(b" ", 2)[1]
        if path == b"/v1/chat/completions":
            time.sleep(600)  # the engine is hung
        body = {b"/metrics": METRICS, b"/version": b'{"version": "0.26.0"}'}.get(path, b"{}")
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    finally:
        c.close()
"""
    + ACCEPT_LOOP
)


def test_a_metrics_answer_that_is_slow_to_parse_cannot_hold_the_plan(demo: Demo) -> None:
    """The liveness look parses `/metrics` with prometheus_client's parser when the 1-token completion
    did not answer (a stalled engine), twice (before and after). That parser takes time quadratic in a
    line's labels: one line of 300,000 labels (3.5 MB, a fifth of the body cap) took 48 s here, and a
    16 MiB line would take about 18 minutes. The HTTP exchange had its deadline; its parse had none.
    main: `plan` (and apply, the lock held) ran past 90 s on one such answer (seen on main). Now only
    the three figures' sample lines reach the parser, each at most `liveness.LINE_MAX` (4 KiB, where a
    vLLM line is a few hundred bytes); a longer one makes the figures unknown."""
    from reconcile.identity import MARKER

    def edit(doc: Any) -> None:
        doc["server"]["liveness"] = {"deadline": "2s"}

    demo.write_spec(edit)
    server = subprocess.Popen(
        ["/usr/bin/python3", "-c", MISBEHAVING, str(demo.port)],
        env={"PATH": "/usr/bin:/bin", MARKER: demo.marker},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        run = watched(demo, "plan", wall=90)
        assert run.returncode is not None, f"plan still parsing after 90 s: {run.output[-1000:]}"
        assert run.seconds < 45, run.seconds  # about 5 s here: the 2 s completion, the rest of a plan
        assert "internal error" not in run.output, run.output[-2000:]
    finally:
        os.killpg(server.pid, 9)
        server.wait()


# Unicode's format characters (category Cf) that round 1's list (names.INVISIBLE: bidi controls,
# zero-width characters, BOM) did not name: soft hyphen, Arabic number sign, Mongolian vowel separator,
# the deprecated U+206A-F, interlinear annotation, a musical format mark, the tag characters (text that
# a terminal draws as nothing: "ASCII smuggling").
FORMAT_CHARS = "\u00ad\u0600\u180e\u206a\ufff9\U0001d173\U000e0001\U000e0041"


@ROOT_ONLY
def test_every_invisible_format_character_in_a_listeners_answer_is_shown_escaped(
    demo: Demo, strangers: list[int]
) -> None:
    """`nobody` on the port answers `/version` with `0.26.0` followed by format characters (Unicode
    category Cf) that round 1's list did not name, tag characters included (a terminal draws
    `0.26.0` and nothing else). main: `status` printed each raw (seen on main). Now the rule is the
    category, not a list: every Cf character is a control character to `shown()`, SafeStream and the
    spec's values (names.CONTROL), and a test holds the list to Python's own unicodedata; one past
    U+FFFF is escaped as its UTF-16 pair, as JSON writes it (`\\ue0041` would read back as two)."""
    hidden = FORMAT_CHARS
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps(hidden)]
    as_nobody(argv, {}, strangers)
    run = subprocess.run(
        demo.command("status"), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=120
    )
    text = _utf8_without_raw(run.stdout + run.stderr)
    raw = [f"U+{ord(c):04X}" for c in hidden if c in text]
    assert raw == [], (raw, text[-2000:])
    # each as its escape; one past U+FFFF as its UTF-16 pair, as JSON writes it
    escaped = "\\u00ad\\u0600\\u180e\\u206a\\ufff9\\ud834\\udd73\\udb40\\udc01\\udb40\\udc41"
    assert "0.26.0" + escaped in text, text[-2000:]
    assert json.loads(f'"{escaped}"') == hidden


def test_the_control_class_holds_every_format_character_python_knows() -> None:
    """names.CONTROL against unicodedata (the interpreter's Unicode version): every character of the
    categories Cc (C0, DEL, C1), Cf (format: bidi, zero-width, tags, ...), Cs (surrogates), Zl and Zp
    (U+2028/9) is matched; a newer Unicode's new format character fails this test, not the terminal."""
    import unicodedata

    from reconcile.safety.names import CONTROL

    missed = [
        f"U+{cp:04X}"
        for cp in range(0x110000)
        if unicodedata.category(chr(cp)) in ("Cc", "Cf", "Cs", "Zl", "Zp") and not CONTROL.fullmatch(chr(cp))
    ]
    assert missed == []


# vllm bench serve's result, as it writes it after the server's answers (its token counts come from the
# answers' `usage`): a count of 400 digits (JSON has no bound), or NaN (json.dumps writes it).
_RESULT = {
    "completed": 1,
    "total_input_tokens": 10,
    "total_output_tokens": 5,
    "mean_ttft_ms": 10.0,
    "mean_e2el_ms": 100.0,
    "output_throughput": 50.0,
}


@pytest.mark.parametrize(
    ("field", "value"),
    [("total_output_tokens", "1" + "0" * 400), ("mean_e2el_ms", "NaN"), ("output_throughput", "Infinity")],
)
def test_a_bench_result_with_numbers_out_of_range_is_one_error_not_a_crash_or_a_damaged_record(
    tmp_path: Path, field: str, value: str
) -> None:
    """`reconcile bench` reads back the result file vllm bench serve wrote, whose token counts are the
    sums of the server's `usage` answers (the server misbehaving: docs/security.md counts it hostile).
    main: a count of 400 digits made `float()` raise OverflowError, which `figures` did not catch (an
    internal error), and NaN or Infinity passed into the figures, which bench/results.json then kept:
    its reader (finite numbers only) moved the whole file aside at the next read, every run's figures
    with it (seen on main). Now a figure that is not a finite number is a BenchError naming it."""
    from reconcile.apply.benchmark import BenchError, _read_result, figures

    text = json.dumps(_RESULT).replace(f'"{field}": {json.dumps(_RESULT[field])}', f'"{field}": {value}')
    path = tmp_path / "result.json"
    path.write_text(text)
    result = _read_result(str(path))
    with pytest.raises(BenchError, match=r"not a finite number|not a number"):
        figures(result)


def test_a_bench_run_its_reader_would_refuse_is_never_written_over_the_kept_runs(tmp_path: Path) -> None:
    """The writer of bench/results.json and its reader must agree: main kept a run whose figure was
    NaN, and the next read (finite numbers only) moved the whole file aside, every earlier run's
    figures with it (seen on main). Now `keep` checks the run against the reader's shape first."""
    from reconcile.apply import bench_records
    from reconcile.errors import ReconcileError

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    figures = {"ttft_s": 0.1, "total_s": 1.0, "decode_tok_s": 5.0}
    bench_records.keep(str(state), {"at": 1.0, "rows": [{"name": "a", "figures": figures}]}, 1)
    bad = {"at": 2.0, "rows": [{"name": "a", "figures": {**figures, "total_s": float("nan")}}]}
    with pytest.raises(ReconcileError, match="not kept"):
        bench_records.keep(str(state), bad, 2)
    assert [r["generation"] for r in bench_records.runs(str(state))] == [1]
    assert sorted(p.name for p in (state / "bench").iterdir()) == ["chart.svg", "results.json"]


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_a_stall_timed_from_a_non_finite_metric_is_kept_across_applies(demo: Demo, value: str) -> None:
    """The liveness look keeps a stall in `liveness-<name>.json` across applies, with the token counter
    it read from `/metrics`; the engine is restarted once stalled for `window`. vLLM's exposition may
    write `NaN` or `+Inf` (the text format allows both). main: the counter's NaN went into the kept
    stall, its reader (finite numbers only) moved the file aside at the next look, and the stall was
    timed afresh at every apply: a hung engine whose counter read NaN was never restarted (seen on
    main). Now a figure that is not a finite number is unknown (None), as a missing one is."""
    from probes.liveness import GENERATED, figures
    from reconcile.liveness import EngineSample, judge, keep_stall, read_stall
    from reconcile.spec.loader import load_spec

    spec = load_spec(str(demo.spec_path)).spec
    demo.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = f"vllm:generation_tokens_total {value}\nvllm:num_requests_running 1\n".encode()
    first = EngineSample(
        1_000_000.0, False, 2.0, 2.0, figures(body).get(GENERATED), figures(body).get(GENERATED)
    )
    verdict = judge(first, 4242, 1.0, window=10.0)
    assert verdict.state == "stalled" and verdict.stall is not None, verdict
    keep_stall(spec, verdict.stall, None)
    kept = read_stall(spec)
    assert kept is not None and kept.since == 1_000_000.0, kept  # main: None, the file moved aside
    later = EngineSample(
        1_000_020.0, False, 2.0, 2.0, figures(body).get(GENERATED), figures(body).get(GENERATED), prior=kept
    )
    assert judge(later, 4242, 1.0, window=10.0).state == "hung"


@ROOT_ONLY
@pytest.mark.parametrize("shape", ["wide", "many"])
def test_a_listeners_process_title_of_many_arguments_stays_short_on_every_line(
    demo: Demo, strangers: list[int], shape: str
) -> None:
    """Round 7 cut each argument of a process title to `SHOWN_MAX` and kept at most 64 (`shown_argv`):
    `nobody` listens on the port from a process with 100 arguments of 2,000 characters (each after a
    U+202E) or with 100,000 one-letter arguments. Already refused on main (kept as the rule's test): no
    line of `plan`, `status` or their `--json` is longer than 2,000 characters, and no U+202E is raw."""
    extra = ["\u202e" + "A" * 2000] * 100 if shape == "wide" else ["a"] * 100_000
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps("fine"), *extra]
    as_nobody(argv, {}, strangers)
    for command in (("plan", "--json"), ("status", "--json"), ("plan",), ("status",)):
        run = watched(demo, *command)
        assert run.returncode in (1, 2), (command, run)
        assert "\u202e" not in run.output, command
        longest = max((len(line) for line in run.output.splitlines()), default=0)
        assert longest <= 2_000, (command, longest)
