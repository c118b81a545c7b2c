"""Issue 24's hostile reader, fifth round, classes 4-6 (bounded network reads, output is data, state
never wedges): attacks on what merged after the fourth round (liveness, `reconcile bench`, the HAProxy
front, the stores, per-deployment state), found by reading docs/security.md and the code alone, each
run for real (a `nobody` listener through setpriv on loopback, real FIFOs and damaged files in real
state and store directories, the real CLI), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.host import http_request
from tests.apply_support import Demo, Run, demo_in, seed_venv
from tests.ownership_support import as_nobody, received
from tests.test_deployments import Multi, multi
from tests.test_liveness import _liveness, engine_core, server_pid, stop
from tests.test_server_support import wait_for
from tests.test_store_default import _source, wheels
from tests.test_store_default import _spec as _store_spec

__all__ = ["multi", "wheels"]  # fixtures: specs/cpu-demo-multi.toml; a wheelhouse of tinyserve

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")

# A listener of nobody's that takes the port once it is free, and answers anything with a Prometheus
# exposition whose token counter is huge: to a reader that takes it for the server, the engine is busy.
BUSY_METRICS = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(600):
    try:
        s.bind(("127.0.0.1", int(sys.argv[1])))
        break
    except OSError:
        time.sleep(0.05)
s.listen(16)
print("ready", flush=True)
body = (b"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 1e12\n"
        b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 7\n"
        b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n")
while True:
    c, _ = s.accept()
    c.settimeout(2)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    sys.stdout.write(data.decode("latin-1") + "\n---\n")
    sys.stdout.flush()
    try:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
        c.sendall(head + body)
    except OSError:
        pass
    c.close()
"""


def _in_flight(port: int) -> bool:
    """The server's own /metrics counts a request running or waiting (the plan's 1-token completion)."""
    text = http_request("GET", "127.0.0.1", port, "/metrics", timeout=5).body.decode()
    found = re.findall(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in found) >= 1


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def live(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A seeded demo whose liveness look waits 10 s for its completion, and one look decides."""
    for demo in demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"})):
        demo.write_spec(_liveness(deadline="10s", window="1s"))
        yield demo


@ROOT_ONLY
def test_a_listener_that_takes_the_port_during_the_liveness_look_never_vouches_for_the_engine(
    live: Demo, strangers: list[int]
) -> None:
    """The engine is hung (its EngineCore stopped); the plan reads /metrics from the server, then sends
    its 1-token completion. The server is stopped meanwhile (vLLM closes its listening socket at once
    and drains the completion in flight), and nobody binds the port. main: the second /metrics read,
    after the completion got no answer, went to nobody's listener unguarded; its token counter made
    the hung engine `busy` and the plan left it running ("busy: 1e+12 tokens generated while a 1-token
    completion waited 10s (7 running, 3 waiting by vLLM's /metrics)", "No changes")."""
    first = live.cli("apply")
    assert first.returncode == 2, first.output
    server = server_pid(live)
    stop(engine_core(live))

    plan = live.start("plan")
    try:
        wait_for(lambda: _in_flight(live.port), 60, "the plan's completion in flight")
        os.kill(server, signal.SIGTERM)  # listening socket closed; the completion drains (20 s)
        wait_for(lambda: _port_free(live.port), 10, "the server's listening socket closed")
        spy = as_nobody(["/usr/bin/python3", "-c", BUSY_METRICS, str(live.port)], {}, strangers)
        run = live.finish(plan, timeout=120)
    finally:
        if plan.poll() is None:
            os.killpg(plan.pid, signal.SIGKILL)
    got = received(spy)
    assert "GET /metrics" not in got, got  # refused after the connect, before a byte was sent
    assert "busy" not in run.stdout and "1e+12" not in run.stdout, run.output
    assert "internal error" not in run.output, run.output


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


@ROOT_ONLY
def test_status_never_reports_a_strangers_metrics_as_the_servers_load(
    demo: Demo, strangers: list[int]
) -> None:
    """No server runs; nobody listens on the deployment's port and answers everything with 200 and a
    Prometheus exposition. main: `reconcile status` read its /metrics unguarded (twice, a second
    apart) and showed its figures as the deployment's serving load ("load: 7 running, 3 waiting"), its
    /v1/models answer too (unkeyed: no key file yet, so no guard)."""
    spy = as_nobody(["/usr/bin/python3", "-c", BUSY_METRICS, str(demo.port)], {}, strangers)
    run = demo.cli("status")
    got = received(spy)
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output
    assert "GET /metrics" not in got and "GET /v1/models" not in got, got
    assert not re.search(r"7 running|3 waiting|1e\+12", run.stdout), run.stdout
    as_json = demo.cli("status", "--json")
    assert '"requests_running": 7' not in as_json.stdout, as_json.stdout


def _finish_or_hang(demo: Demo, proc: subprocess.Popen[str], seconds: float) -> Run:
    """The run's end, or a failure that says it hung (killed with its process group)."""
    try:
        return demo.finish(proc, timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(map(str, proc.args))}: still running after {seconds:.0f}s (hung)")  # type: ignore[arg-type]


def test_a_fifo_at_a_venv_realizations_manifest_never_hangs_apply(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    """The store's realizations carry `.reconcile-realization.json` (what they hold, written once they
    converged); an apply that realizes a new venv reads every other one's (share_files: hard links to
    the same bytes). main: a plain open(), so a FIFO there (a damaged store) hung that apply, and
    every later one, the apply lock held."""
    source = _source(tmp_path)
    _store_spec(demo, wheels, "1.0", source)
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    (old,) = sorted(p for p in (demo.state_dir / "store").iterdir() if p.name.endswith("-venv"))
    manifest = old / ".reconcile-realization.json"
    assert manifest.is_file()
    manifest.unlink()
    os.mkfifo(manifest, 0o600)

    _store_spec(demo, wheels, "2.0", source)
    run = _finish_or_hang(demo, demo.start("apply"), 120)
    assert run.returncode == 2, run.output
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output
    aside = [p for p in old.iterdir() if p.name.startswith(".reconcile-realization.json.corrupt-")]
    assert len(aside) == 1 and stat.S_ISFIFO(aside[0].lstat().st_mode), aside
    assert f"{manifest} was a FIFO: moved aside to {aside[0]}" in run.output, run.output
    again = demo.cli("apply")
    assert again.returncode == 0, again.output


@pytest.mark.parametrize("damage", ["file", "fifo", "symlink"])
def test_a_deployments_state_dir_that_is_not_a_directory_never_wedges_the_machine(
    multi: Multi, tmp_path: Path, damage: str
) -> None:
    """<state_dir>/deployments/<name>/ holds one deployment's state (records, conditions, liveness,
    generations). A crash, a full disk or a hand edit can leave something else at that name: the other
    deployment must still be applied, and the damaged one's run must say what is there in one line
    (moved aside), never stop or follow a link out of the state dir. main: a file or a FIFO there
    stopped every scheduled apply (`[machine].state_dir is not a directory`, exit 1, for good); a
    symlink was followed: the pidfile, conditions and generations written where it pointed."""
    first = multi.cli("apply")
    assert first.returncode == 2, first.stdout + first.stderr
    draft = multi.state_dir / "deployments" / "draft"
    assert draft.is_dir()
    shutil.rmtree(draft)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if damage == "file":
        draft.write_text("not a directory\n")
    elif damage == "fifo":
        os.mkfifo(draft, 0o600)
    else:
        draft.symlink_to(elsewhere)
    run = multi.cli("apply", "--scheduled")
    output = run.stdout + run.stderr
    assert "internal error" not in output and "Traceback" not in output, output
    assert run.returncode in (0, 2), output
    assert not list(elsewhere.iterdir()), "nothing written through the link"
    aside = [p for p in draft.parent.iterdir() if p.name.startswith("draft.corrupt-")]
    assert len(aside) == 1, sorted(draft.parent.iterdir())
    assert f"{draft} was " in output and f"moved aside to {aside[0]}" in output, output
    assert aside[0].is_symlink() if damage == "symlink" else not aside[0].is_dir()  # moved as it was
    assert draft.is_dir() and not draft.is_symlink()  # made afresh by the run
    again = multi.cli("apply", "--scheduled")
    assert again.returncode == 0, again.stdout + again.stderr  # both deployments converged


NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release 13.0, V13.0.88" ;;
  --list-gpu-arch) echo "compute_90 compute_100" ;;
esac
"""


@pytest.mark.parametrize("damage", ["fifo", "directory"])
def test_a_damaged_nvcc_answer_cache_never_hangs_the_plan(yard: Path, damage: str) -> None:
    """`[cuda]`'s probe keeps nvcc's answers in ~/.cache/reconcile/nvcc.json (asked again when the
    binary changes). docs/security.md says the per-user caches are opened non-blocking and a damaged
    entry is a miss. main: a plain open(), so a FIFO there hung every plan and apply (the lock
    held) of a spec with [cuda]."""
    from tests.test_hostile_reader import cli, spec_text

    target = yard / "cuda-13.0"
    (target / "bin").mkdir(parents=True)
    (target / "include").mkdir()
    nvcc = target / "bin" / "nvcc"
    nvcc.write_text(NVCC)
    nvcc.chmod(0o755)
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard) + f'\n[cuda]\nhome = "{target}"\n')
    cache = yard / "cache" / "reconcile" / "nvcc.json"
    cache.parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(cache, 0o600) if damage == "fifo" else cache.mkdir()
    try:
        run = cli(yard, "plan", spec=spec)
    except subprocess.TimeoutExpired:
        pytest.fail("plan hung on the nvcc cache")
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    assert "13.0" in run.stdout, run.stdout  # nvcc was asked instead


def test_root_never_takes_nvccs_answers_from_another_users_cache(yard: Path) -> None:
    """Root run with another user's XDG_CACHE_HOME (`sudo -E`): the nvcc cache there is theirs. Its
    key (nvcc's real path, size, inode, mtime) is no secret: nobody can stat root's nvcc. main: root
    read nobody's nvcc.json and planned with the CUDA release it named."""
    import json
    import marshal

    from tests.ownership_support import NOBODY
    from tests.test_hostile_reader import cli, spec_text

    target = yard / "cuda-13.0"
    (target / "bin").mkdir(parents=True)
    (target / "include").mkdir()
    nvcc = target / "bin" / "nvcc"
    nvcc.write_text(NVCC)
    nvcc.chmod(0o755)
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard) + f'\n[cuda]\nhome = "{target}"\n')
    st = nvcc.stat()
    key = {"realpath": str(nvcc), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    forged = {
        str(nvcc): {
            **key,
            "version_output": "Cuda compilation tools, release 99.9, V99.9.99",
            "arch_output": "compute_999",
        }
    }
    theirs = yard / "cache" / "reconcile"
    theirs.mkdir(parents=True)
    (theirs / "nvcc.json").write_text(json.dumps(forged))  # what main read
    (theirs / "nvcc.marshal").write_bytes(marshal.dumps(forged))  # what the private cache would read
    for path in (yard / "cache", theirs, *theirs.iterdir()):
        os.chown(path, NOBODY, NOBODY)
    (theirs / "nvcc.marshal").chmod(0o600)
    theirs.chmod(0o700)
    run = cli(yard, "plan", spec=spec)
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    assert "99.9" not in run.stdout and "13.0" in run.stdout, run.stdout


@pytest.mark.parametrize("where", ["apt policy cache of nobody's", "apt source list"])
def test_a_fifo_among_the_files_the_apt_probe_reads_never_hangs_the_plan(yard: Path, where: str) -> None:
    """The apt probe reads `[apt] sources_dir`'s lists and keeps `apt-cache policy`'s answer in the
    per-user cache. main: both by a blocking open(): a FIFO in the sources dir (a damaged one), or one
    that nobody made in their XDG_CACHE_HOME (root run with `sudo -E`: the owner check came after the
    open), hung every plan with an [apt] package not installed."""
    from probes import apt
    from tests.ownership_support import NOBODY
    from tests.test_hostile_reader import cli, spec_text

    sources = yard / "sources.list.d"
    sources.mkdir()
    (sources / "a.list").write_text("deb http://deb.example.org/debian stable main\n")
    spec = yard / "spec.toml"
    apt_table = f'\n[apt]\nsources_dir = "{sources}"\npackages = ["reconcile-no-such-package"]\n'
    spec.write_text(spec_text(yard) + apt_table)
    if where == "apt source list":
        os.mkfifo(sources / "b.list", 0o644)
    else:
        theirs = yard / "cache" / "reconcile"
        theirs.mkdir(parents=True)
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(yard / "cache")
        try:
            names = {os.path.basename(apt._cache_file(["reconcile-no-such-package"]))}
        finally:
            os.environ.pop("XDG_CACHE_HOME")
            if old is not None:
                os.environ["XDG_CACHE_HOME"] = old
        names |= {n.rsplit(".", 1)[0] + ext for n in names for ext in (".json", ".marshal")}
        for name in names:  # whatever name the cache uses
            os.mkfifo(theirs / name, 0o600)
        for path in (yard / "cache", theirs, *theirs.iterdir()):
            os.chown(path, NOBODY, NOBODY)
    try:
        run = cli(yard, "plan", spec=spec)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plan hung on a FIFO ({where})")
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    assert "reconcile-no-such-package" in run.stdout, run.stdout


def test_a_fifo_at_the_model_config_never_hangs_a_rollback(demo: Demo, wheels: Path, tmp_path: Path) -> None:
    """A rollback puts the generation's config.json bytes back before its plan (switching.prepare:
    restore_config), comparing them with what the model dir holds. main: a plain open() of the model
    dir's config.json, so a FIFO there hung `reconcile rollback`, the apply lock held."""
    source = _source(tmp_path)
    _store_spec(demo, wheels, "1.0", source)
    assert demo.cli("apply").returncode == 2
    kept = (demo.model_dir / "config.json").read_bytes()
    _store_spec(demo, wheels, "2.0", source)
    assert demo.cli("apply").returncode == 2
    config = demo.model_dir / "config.json"
    config.unlink()
    os.mkfifo(config, 0o644)

    run = _finish_or_hang(demo, demo.start("rollback", "1"), 120)
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output
    assert run.returncode == 2 and "rolled back to generation 1" in run.stdout, run.output
    assert stat.S_ISREG(config.lstat().st_mode) and config.read_bytes() == kept
