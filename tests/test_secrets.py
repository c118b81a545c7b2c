"""Secrets never leave their place except into the server's environment: a full apply (from nothing:
venv, pip, model, key, server) and status cycle of the CPU demo, every byte scanned.

The secrets: the API key; an HF_TOKEN written inline in [server] env; a token read through
[server] secret_files; the password of an index URL (a loopback index that wants Basic auth, so
pip really uses it). Scanned for each (and for any 16-character piece of it): everything every
command printed; every file under the demo's root, the spec cache and the metrics file, bytes and
all (the secret's own file aside, and the spec and its cache for those written into the spec); the
argv of every process started, caught at its execve by strace; and the environment of each, where
only the server's own processes (they carry the deployment marker) may hold the server's secrets.
"""

from __future__ import annotations

import base64
import http.server
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import tomlkit

from reconcile.host import http_request
from tests.apply_support import Demo, Run, demo_in

pytestmark = [pytest.mark.slow]

STRACE = shutil.which("strace")


@dataclass(frozen=True)
class Exec:
    pid: int
    argv: list[str]
    env: list[str]


_STRING = r'"((?:[^"\\]|\\.)*)"(\.\.\.)?'
# Failed tries count too (execvp's walk along PATH passes the same argv to each).
_EXEC = re.compile(rf"^(\d+) +execve\({_STRING}, \[(.*?)\], \[(.*)\](?:\) = | <unfinished \.\.\.>)")


def _strings(text: str) -> list[str]:
    found = []
    for m in re.finditer(_STRING, text):
        assert m.group(2) is None, f"strace cut a string short: {m.group(0)[:80]}"
        found.append(m.group(1).encode().decode("unicode_escape", errors="replace"))
    return found


def parse_trace(path: Path) -> list[Exec]:
    """Each execve in an `strace -f -v -e trace=execve` log: pid, argv, environment."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = _EXEC.match(line)
        if m:
            out.append(Exec(int(m.group(1)), _strings(m.group(4)), _strings(m.group(5))))
    return out


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    if STRACE is None:
        pytest.skip("strace is not installed: every process's argv cannot be caught")
    yield from demo_in(tmp_path / "demo")  # beside it, not in it: the traces (they hold the server's env)


def traced(demo: Demo, traces: Path, env: dict[str, str], *args: str) -> tuple[Run, list[Exec]]:
    """The CLI under strace; once it exits, strace lets go of what it left running (the server)."""
    assert STRACE is not None
    trace = traces / f"{len(demo.runs)}.trace"
    argv = demo.command(*args)
    strace = [
        STRACE,
        "-f",
        "-q",
        "-I",
        "2",
        "-v",
        "-s",
        "1000000",
        "-e",
        "trace=execve",
        "-o",
        str(trace),
        "--",
        *argv,
    ]
    proc = subprocess.Popen(
        strace, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(demo.root)
    )
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    readers = [
        threading.Thread(target=lambda s=s, k=k: chunks[k].extend(iter(lambda: s.read(4096), b"")))
        for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))
    ]
    for r in readers:
        r.start()

    def exit_code() -> int | None:
        text = trace.read_text(errors="replace") if trace.exists() else ""
        first = re.match(r"(\d+) ", text)  # strace's first tracee: the CLI
        done = first and re.search(
            rf"^{first.group(1)} +\+\+\+ (exited with (\d+)|killed by \S+)", text, re.M
        )
        return (int(done.group(2)) if done.group(2) else -1) if done else None

    deadline = time.monotonic() + 240
    while exit_code() is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # strace detaches from its remaining tracees and exits
    proc.wait(timeout=30)
    code = exit_code()
    for r in readers:
        r.join(timeout=30)
    assert code is not None, f"{args}: did not finish"
    run = Run(
        argv,
        code,
        b"".join(chunks["out"]).decode(errors="replace"),
        b"".join(chunks["err"]).decode(errors="replace"),
    )
    demo.runs.append(run)
    return run, parse_trace(trace)


def pieces(key: str) -> list[bytes]:
    """The key and every 16-character window of it: a truncated or partly masked print is still a leak."""
    return [key.encode()] + [key[i : i + 16].encode() for i in range(len(key) - 15)]


def leaks(data: bytes, key: str) -> bool:
    return any(p in data for p in pieces(key))


INLINE_TOKEN = "hf_q8ZrT2vXw5NcLm0aPbYe7KdJ4sGuHi1Ao"
FILE_TOKEN = "hf_W3nEx9QyRt6UvBz2MkLp8CdFs0JhGaYo"
INDEX_PASSWORD = "idx-7Hq2Zp9Lw4Xm1Rv6Ks3Tb8Nc5Jd0Fg"


class _AuthIndex(http.server.BaseHTTPRequestHandler):
    """A package index that answers 404 to everything, noting the credentials it was sent."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def auth_index() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AuthIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def with_secrets(demo: Demo, port: int) -> Any:
    """The demo spec, plus an inline HF_TOKEN, a secret file and an index URL with a password;
    returns the edit (write_spec starts from the demo spec each time)."""
    token_file = demo.root / "hf.token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(FILE_TOKEN + "\n")
    token_file.chmod(0o600)

    def edit(doc: Any) -> None:
        env = tomlkit.inline_table()
        env.update({**dict(doc["server"]["env"]), "HF_TOKEN": INLINE_TOKEN})
        doc["server"]["env"] = env
        doc["server"]["secret_files"] = {"HUGGING_FACE_HUB_TOKEN": str(token_file)}
        doc["venv"]["extra_index_urls"] = [f"http://scan:{INDEX_PASSWORD}@127.0.0.1:{port}/simple"]

    demo.write_spec(edit)
    return edit


def test_the_key_appears_nowhere_but_its_file_and_the_servers_environment(
    demo: Demo, tmp_path: Path, auth_index: int
) -> None:
    traces, cache = tmp_path / "traces", tmp_path / "cache"
    traces.mkdir()
    metrics, planfile = demo.root / "metrics.prom", demo.root / "plan.json"
    env = {**demo.env(), "XDG_CACHE_HOME": str(cache)}
    secrets = with_secrets(demo, auth_index)
    execs: list[Exec] = []

    def cli(*args: str, expect: tuple[int, ...] = (0,)) -> Run:
        run, seen = traced(demo, traces, env, *args)
        assert run.returncode in expect, (args, run.output)
        execs.extend(seen)
        return run

    cli("plan", expect=(2,))
    cli("apply", "--textfile", str(metrics), expect=(2,))  # from nothing: venv, pip, model, key, server
    cli("plan", "--json", "--out", str(planfile))
    for args in (("status",), ("status", "--json"), ("check",), ("apply", "--json"), ("history",)):
        cli(*args)
    cli("apply", "--scheduled", "--textfile", str(metrics))

    def more_seqs(doc: Any) -> None:
        secrets(doc)
        doc["server"]["args"]["max-num-seqs"] = 6

    demo.write_spec(more_seqs)
    cli("apply", expect=(2,))  # a restart: the key is handed to a new server
    cli("diff", "1", "2")
    cli("status")

    key = demo.key_file.read_text().strip()
    assert len(key) >= 32
    # pip used the index with its credentials (from a netrc it was given, not from its argv).
    expected = "Basic " + base64.b64encode(f"scan:{INDEX_PASSWORD}".encode()).decode()
    assert _AuthIndex.seen and set(_AuthIndex.seen) == {expected}, _AuthIndex.seen
    assert demo.server_environ("HF_TOKEN") == INLINE_TOKEN
    assert demo.server_environ("HUGGING_FACE_HUB_TOKEN") == FILE_TOKEN
    token = {"Authorization": f"Bearer {key}"}
    assert http_request("GET", "127.0.0.1", demo.port, "/v1/models", headers=token).status == 200

    stored = [p for root in (demo.root, cache) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert metrics in stored and planfile in stored and any(p.parent.name == "generations" for p in stored)
    # A spec holding a secret inline is never cached (the spec cache, the preflight memo): scanned.
    assert not any(p.suffix == ".marshal" and p.parent.name in ("specs", "preflight") for p in stored)
    names = {os.path.basename(e.argv[0]) for e in execs if e.argv}
    assert "git" in names, names  # (dpkg-query no more: apt reads dpkg's status file)
    assert any("serve" in e.argv for e in execs), "the server's start was not seen"
    assert any("pip" in " ".join(e.argv) for e in execs), "pip's run was not seen"
    # The spec holds what its author wrote into it; nothing else may.
    spec_copies = {demo.spec_path}
    scan(demo, stored, execs, traces, key, own={demo.key_file}, server_env=True)
    scan(demo, stored, execs, traces, INLINE_TOKEN, own=spec_copies, server_env=True)
    scan(demo, stored, execs, traces, FILE_TOKEN, own={demo.root / "hf.token"}, server_env=True)
    scan(demo, stored, execs, traces, INDEX_PASSWORD, own=spec_copies, server_env=False)
    assert not list(Path(tempfile.gettempdir()).glob("reconcile-netrc-*"))  # pip's netrc is gone


def scan(
    demo: Demo,
    stored: list[Path],
    execs: list[Exec],
    traces: Path,
    secret: str,
    *,
    own: set[Path],
    server_env: bool,
) -> None:
    """`secret` in no output, no stored file but `own`, no argv, and no environment but the server's."""
    for run in demo.runs:
        assert not leaks(run.output.encode(), secret), run.argv

    # Every byte stored: state, generations, reports, lock, pidfile, logs, model dir, venv, cache, metrics.
    for path in stored:
        if path not in own:
            assert not leaks(path.read_bytes(), secret), path

    # Every process started: argv never; the environment only in the server's own processes.
    for e in execs:
        assert not leaks("\0".join(e.argv).encode(), secret), e.argv[:4]
        if leaks("\0".join(e.env).encode(), secret):
            assert server_env and f"RECONCILE_DEPLOYMENT={demo.marker}" in e.env, e.argv[:4]
    holders = [e for e in execs if leaks("\0".join(e.env).encode(), secret)]
    assert bool(holders) == server_env
    assert all("serve" in e.argv for e in holders if "vllm" in os.path.basename(e.argv[0]))

    # Nothing else in the traces holds it: each line with it is an execve parsed above.
    for trace in traces.iterdir():
        for line in trace.read_text(errors="replace").splitlines():
            assert not leaks(line.encode(), secret) or _EXEC.match(line), line[:200]

    # And what runs now: no command line holds it; only marked processes hold it in their environment.
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        assert not leaks(cmdline, secret), cmdline[:200]
        if leaks(environ, secret):
            assert f"RECONCILE_DEPLOYMENT={demo.marker}".encode() in environ.split(b"\0"), cmdline[:200]
