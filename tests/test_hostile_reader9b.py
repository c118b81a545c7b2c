"""Issue 24's hostile reader, ninth round, classes 4-6 (bounded network reads, output is data, state
never wedges) and the process-ownership rules: attacks on what the eighth round added (the control
class as Unicode's Cf, the liveness parse's bounds, bench's keep() check, the pinned HAProxy master)
and on what no round attacked yet, found by reading docs/security.md and the code alone, each run for
real (a listener of `nobody` on the port, a hub listening on loopback, real files, FIFOs and links in
a real state directory), each seen succeeding on main before its fix unless its docstring says it was
already refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.apply_support import DEMO_MODEL, Demo, demo_in, seed_venv
from tests.ownership_support import as_nobody
from tests.test_network_attacks import HOSTILE

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


# --- class 5: characters drawn as nothing that are not format characters (Cf) ---------------------

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1): the characters a
# renderer draws as nothing unless it supports them. Most are Cf (round 8's rule); these are not: the
# combining grapheme joiner (Mn), the Hangul fillers U+115F, U+1160, U+3164, U+FFA0 (Lo), the Khmer
# inherent vowels (Mn), the Mongolian free variation selectors and every variation selector (Mn:
# U+FE00-FE0F, U+E0100-E01EF), and the ones still unassigned (Cn) that Unicode reserves as ignorable
# (U+2065, U+FFF0-FFF8, U+E0000, U+E0002-E001F, U+E0080-E00FF, U+E01F0-E0FFF).
DEFAULT_IGNORABLE = [
    *(0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFEFF, 0xFFA0),
    *range(0x180B, 0x1810),
    *range(0x200B, 0x2010),
    *range(0x202A, 0x202F),
    *range(0x2060, 0x2070),
    *range(0xFE00, 0xFE10),
    *range(0xFFF0, 0xFFF9),
    *range(0x1BCA0, 0x1BCA4),
    *range(0x1D173, 0x1D17B),
    *range(0xE0000, 0xE1000),
]
NOT_FORMAT = "\u034f\u115f\u1160\u17b4\u180b\u180f\u3164\ufe0f\uffa0\U000e0100\U000e01ef"


@ROOT_ONLY
def test_every_character_drawn_as_nothing_in_a_listeners_answer_is_shown_escaped(
    demo: Demo, strangers: list[int]
) -> None:
    """`nobody` on the port answers `/version` with `0.26.0` followed by characters a terminal draws
    as nothing that are not Unicode format characters (Cf): the combining grapheme joiner, Hangul
    fillers, Khmer inherent vowels, Mongolian and other variation selectors (VS16, VS17, VS256).
    main: `status` printed each raw (seen on main: 11 of 11), since round 8's rule was the category Cf.
    Now the rule is Unicode's Default_Ignorable_Code_Point (a superset of the Cf it held), with Cc, Cs,
    Zl, Zp, for shown(), SafeStream and spec values alike."""
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps(NOT_FORMAT)]
    as_nobody(argv, {}, strangers)
    run = subprocess.run(
        demo.command("status"), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=120
    )
    text = (run.stdout + run.stderr).decode("utf-8")
    raw = [f"U+{ord(c):04X}" for c in NOT_FORMAT if c in text]
    assert raw == [], (raw, text[-2000:])
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else json.dumps(c).strip('"') for c in NOT_FORMAT
    )
    assert "0.26.0" + escaped in text, text[-2000:]


def test_the_control_class_holds_every_default_ignorable_character() -> None:
    """names.CONTROL against Unicode's Default_Ignorable_Code_Point list above (Python's unicodedata
    has no such property; the list is DerivedCoreProperties.txt's): every one is matched, so shown(),
    SafeStream and the spec's values escape or refuse each."""
    from reconcile.safety.names import CONTROL

    missed = [f"U+{cp:04X}" for cp in DEFAULT_IGNORABLE if not CONTROL.fullmatch(chr(cp))]
    assert missed == []


@pytest.mark.parametrize("text", ["\u0301" * 5000, "\ue000\uf8ff\U000f0000", "\u0378\U0003ffff"])
def test_marks_private_use_and_unassigned_characters_stay_within_one_shown_line(text: str) -> None:
    """Tried and already refused (seen on main): a stack of 5,000 combining marks on one letter (Mn,
    "Zalgo"), private-use characters (Co: a font's icons) and unassigned ones (Cn) are drawn as
    something, not nothing, and reorder nothing: shown() passes them, cut to SHOWN_MAX with no control
    character and no newline, so they stay on their one line of output."""
    from reconcile.safety.display import SHOWN_MAX, for_stream, shown

    out = shown("0.26.0" + text)
    assert len(out) <= SHOWN_MAX and "\n" not in out and for_stream(out) == out


# --- class 6: a state writer whose own reader moves its file aside -------------------------------


def _big_source(tmp_path: Path) -> Path:
    """A copy of the demo model whose config.json holds a 17 MiB string (valid JSON, under the model
    dir's 64 MiB bound on config.json; a source tree's or a hub repo's writer chooses it)."""
    source = tmp_path / "big-model-src"
    source.mkdir()
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (source / name).write_bytes((DEMO_MODEL / name).read_bytes())
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    config["_name_or_path"] = "x" * (17 << 20)
    (source / "config.json").write_text(json.dumps(config))
    return source


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def test_a_config_json_reconcile_keeps_for_a_generation_is_never_moved_aside_by_its_reader(
    seeded: Demo, tmp_path: Path
) -> None:
    """Each generation keeps the model's config.json bytes (profile/config-<sha256>.json) so that
    `diff` and a rollback can put them back. The model dir's config.json is read up to 64 MiB, the
    kept copy by the state records' reader up to 16 MiB. main: a 17 MiB config.json (a source tree's
    or a hub repo's) was kept, then its own reader moved it aside at the first `diff` ("was larger than
    the 16.0 MiB it can be: moved aside"; seen on main), and `diff 1 2` showed "(kept bytes): missing"
    instead of the key that changed: that generation's config was lost. Now every profile file is
    written only when its reader reads it back (statefiles.unreadable), and the kept config's bound is
    the model dir's own (64 MiB)."""
    demo = seeded
    source = _big_source(tmp_path)

    def edit(factor: float):  # type: ignore[no-untyped-def]
        def change(doc):  # type: ignore[no-untyped-def]
            doc["model"]["source"] = str(source)
            doc["model"]["config"]["rope_parameters"]["factor"] = factor

        return change

    demo.write_spec(edit(2.0))
    first = demo.cli("apply", timeout=300)
    assert first.returncode == 2, first.output
    demo.write_spec(edit(4.0))
    second = demo.cli("apply", timeout=300)
    assert second.returncode == 2, second.output
    diff = demo.cli("diff", "1", "2")
    profile = demo.state_dir / "profile"
    aside = sorted(p.name for p in profile.iterdir() if ".corrupt-" in p.name)
    assert aside == [], (aside, diff.output)
    assert "missing" not in diff.stdout and "factor" in diff.stdout, diff.output
    assert "internal error" not in diff.output, diff.output


class _Hub(BaseHTTPRequestHandler):
    """A hub (or mirror at HF_ENDPOINT) whose model listing gives a file the size `SIZE` and the commit
    `SHA` (raw JSON)."""

    SIZE = "0"
    SHA = json.dumps("a" * 40)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        siblings = f'[{{"rfilename": "model.safetensors", "size": {self.SIZE}}}]'
        body = f'{{"id": "o/m", "sha": {self.SHA}, "siblings": {siblings}}}'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


LISTING = r"""
import sys
from probes.hub import listing
for _ in range(2):
    found = listing("o/m", "main", sys.argv[1], offline=False)
    print("listing:", type(found).__name__, repr(getattr(found, "commit", "")), getattr(found, "cached", ""),
          getattr(found, "reason", ""))
"""


def with_hub(script: str, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -c script *args` with HF_ENDPOINT at a _Hub on loopback (its SIZE and SHA as set)."""
    hub = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}",
        "HF_HUB_OFFLINE": "1" if offline else "",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, env=env
        )
    finally:
        hub.shutdown()


@pytest.mark.parametrize("size", ["-5", '"x"', "1e400", "[1]"])
def test_a_hub_listing_of_odd_sizes_is_refused_and_never_cached_for_its_reader_to_discard(
    tmp_path: Path, size: str
) -> None:
    """The plan's hub listing (probes.hub: the weights' size before a download) is cached under
    <state_dir>/cache/hub/ from the hub's answer. main (seen): a size of -5 was cached as it came, and
    the cache's reader (sizes are counts, >= 0) moved it aside at the next plan and asked the hub
    again, every plan; a size of "x", 1e400 or [1] ended the listing in ValueError, OverflowError or
    TypeError (an internal error wherever it is asked). Now a size that is not a count is the hub's
    bad answer (Unavailable, named), and a listing is cached only when its reader takes it back."""
    _Hub.SIZE = size
    cache = tmp_path / "state" / "cache" / "hub"
    run = with_hub(LISTING, str(cache))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines and all(line.startswith("listing: Unavailable") for line in lines), run.stdout
    assert "not a size" in lines[0], lines
    left = [p.name for p in cache.rglob("*") if ".corrupt-" in p.name or p.name.endswith(".json")]
    assert left == [], left


# --- class 4: vllm bench serve's result ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "symlink", "deep", "huge", "strings"])
def test_a_bench_result_of_any_odd_kind_is_one_bench_error(tmp_path: Path, kind: str) -> None:
    """Tried and already refused (seen on main): the result file vllm bench serve writes is read by
    untrusted.read_regular (16 MiB, regular files only, never followed) from a 0700 mkdtemp of root's
    (nobody cannot write there); a FIFO or a symlink there, nesting 100,000 deep, an array of 20
    million per-request figures (past the cap), or strings where numbers belong ("nan", "1e999") is
    one BenchError, never a hang, a crash or a figure kept."""
    from reconcile.apply.benchmark import BenchError, _read_result, figures

    path = tmp_path / "result.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text('{"completed": 1}')
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "huge":
        path.write_text('{"completed": 1, "ttfts": [' + "1," * (10 << 20) + "1]}")
    else:
        path.write_text(
            json.dumps(
                {
                    "completed": "1",
                    "total_input_tokens": "10",
                    "total_output_tokens": "nan",
                    "mean_ttft_ms": "1e999",
                    "mean_e2el_ms": "100",
                    "output_throughput": "50",
                }
            )
        )
    with pytest.raises(BenchError):
        figures(_read_result(str(path)))


# --- class 4: the liveness parse's figures ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "want"),
    [
        # a figure repeated with conflicting values: summed, as vLLM's per-engine lines are
        (b"vllm:num_requests_running 1\nvllm:num_requests_running 5\n", {"vllm:num_requests_running": 6.0}),
        # another deployment's model_name: a label set like any other (the port's listeners are ours)
        (
            b'vllm:generation_tokens_total{model_name="other"} 7\nvllm:generation_tokens_total 1\n',
            {"vllm:generation_tokens_total": 8.0},
        ),
        # the figures hidden past 1,000 other lines: only the figures' lines count, and they are found
        (b"x 1\n" * 5000 + b"vllm:num_requests_waiting 3\n", {"vllm:num_requests_waiting": 3.0}),
        # a look-alike name (a prefix of the figure): not the figure
        (b"vllm:num_requests_running_fake 9\n", {}),
    ],
)
def test_the_liveness_figures_are_read_by_name_from_the_deployments_own_listener(
    body: bytes, want: dict[str, float]
) -> None:
    """Tried and already refused (seen on main): /metrics is read only when every listener on the port
    is the deployment's own (probes.health._guard, round 5), so another deployment's server or
    nobody's cannot answer it; what the own server writes is summed by sample name over label sets
    (vLLM writes one line per engine), and lines before the figures do not count toward LINES_MAX."""
    from probes.liveness import figures

    assert figures(body) == want


# --- ownership: the adoption's one unguarded /health (rounds 3 and 8 left it open) -------------------


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def apply_killed_while_loading(demo: Demo, load_s: int, *args: str) -> None:
    """An apply (with `args`) starts the server, whose model takes `load_s` seconds to load, and is
    SIGKILLed once the launch is recorded (a timer's apply stopped by systemd): the server lives on,
    loading, in its own session and cgroup."""
    import signal
    import time

    def slow(doc):  # type: ignore[no-untyped-def]
        doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = str(load_s)
        doc["server"]["startup_timeout"] = "120s"

    demo.write_spec(slow)
    first = demo.start("apply", *args)
    try:
        deadline = time.monotonic() + 60
        while not demo.server_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert demo.server_pids(), "the server never started"
        time.sleep(1)  # the launch recorded; the model still loading
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()


@ROOT_ONLY
def test_a_server_still_loading_is_never_reported_healthy_on_a_strangers_answers(
    demo: Demo, strangers: list[int]
) -> None:
    """An apply starts the server, and is killed while the server loads its model (a timer's apply
    stopped by systemd; the server lives on in its own session and cgroup). The fake, as vLLM 0.26.0's
    api_server.setup_server, binds its port with SO_REUSEADDR before the load and listens only once the
    engine is up, so while it loads another socket with SO_REUSEADDR (Python's http.server sets it) can
    bind the port and listen first. nobody binds it and answers /health and /version.
    main (seen): the plan's server row read nobody's answers as the server's: "✓ server ... pid N
    healthy on 127.0.0.1:P, vLLM 0.26.0" (the version nobody's), although docs/security.md says the row
    names a foreign holder (only the preflight's host.port did, which kept apply from reaching the
    adoption's own unguarded /health: not reproduced, see the docs). Now a /health or /version answered
    while the port holds a listener that is not the deployment's is the port's, never the server's:
    the row names the holder instead of "healthy" and a version (`status` already named it)."""
    apply_killed_while_loading(demo, 60)
    assert not _listening(demo.port)
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "normal", "/none"]
    as_nobody(argv, {}, strangers)
    plan = demo.cli("plan")
    rows = [
        line
        for line in plan.stdout.splitlines()
        if line.lstrip().startswith(("✓ server", "~ server", "! server"))
    ]
    assert rows and "healthy" not in rows[0] and "vLLM 0.26.0" not in rows[0], plan.output
    assert "held by" in rows[0] and "nobody" in rows[0], plan.output
    run = demo.cli("apply", timeout=300)
    assert "with the same launch identity" not in run.stdout, run.output
    assert "internal error" not in run.output and "internal error" not in plan.output, run.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reason", "a" * 70_000], "give a shorter --reason"),
        (["--reason", "maintenance", "--for", "99999999999999h"], "give a shorter one"),
    ],
)
def test_a_pause_its_reader_would_refuse_is_one_clear_error_and_the_old_pause_stays(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """`reconcile pause` writes paused.json, which every scheduled apply reads (64 KiB, "until" a time
    up to 9999-12-31). main (seen): a reason of 70,000 characters was written, then moved aside by the
    next read ("larger than the 64 KiB it can be"), the pause's reason, user and end replaced by
    "paused.json was damaged"; `--for 99999999999999h` wrote an "until" of 3.6e17 s and ended the pause
    command in `internal error: OSError: [Errno 75] Value too large`, then the same move aside. Now the
    writer checks the pause against its reader's bound and shape first: one line naming the fix, exit
    1, and the pause in force before stays as it was."""
    spec = tmp_path / "spec.toml"
    state = tmp_path / "state"
    spec.write_text(f'[machine]\nstate_dir = "{state}"\n')
    base = [sys.executable, "-m", "reconcile", "pause", "--spec", str(spec)]
    first = subprocess.run([*base, "--reason", "disk swap"], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    kept = (state / "paused.json").read_bytes()
    run = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout[-500:] + run.stderr[-500:]
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-500:]
    assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]
    assert (state / "paused.json").read_bytes() == kept
    status = subprocess.run(
        [sys.executable, "-m", "reconcile", "status", "--spec", str(spec)], capture_output=True, text=True
    )
    assert "disk swap" in status.stdout and "damaged" not in status.stdout + status.stderr, status.stdout
    assert not [p.name for p in state.iterdir() if ".corrupt-" in p.name]
