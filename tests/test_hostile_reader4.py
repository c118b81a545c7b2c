"""Issue 24's hostile reader, fourth round: attacks on what was merged after the third (the closure lock,
several deployments per spec, `reconcile bench`, liveness, the one switch), found by reading
docs/security.md and the code alone, each run for real (real spec and lock files, real processes, a
`nobody` listener through setpriv), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import DEMO_MODEL, Demo, demo_in
from tests.ownership_support import NOBODY, SPY, as_nobody, received, root_only
from tests.test_deployments import Multi, multi
from tests.test_server_support import FAKE_VLLM

__all__ = ["multi"]  # the fixture: specs/cpu-demo-multi.toml in tmp_path, with a real venv

REPO = Path(__file__).resolve().parent.parent
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

# A deployment name from a spec becomes <state_dir>/deployments/<name>/, <name>.pid, liveness-<name>.json
# and a unit name. TOML's quoted keys can hold anything.
HOSTILE_NAMES = {
    "dotdot": '".."',
    "slash": '"a/b"',
    "absolute": '"/etc"',
    "bell": '"a\\u0007b"',
    "newline": '"a\\nb"',
    "long": '"' + "x" * 300 + '"',  # past NAME_MAX (255) as a path component
}


@pytest.mark.parametrize("label", sorted(HOSTILE_NAMES))
def test_a_hostile_deployment_name_is_refused_at_load_by_a_scheduled_apply(multi: Multi, label: str) -> None:
    """main: `..`, `/`, control characters were refused, but as `internal error: KeyError: 'name'`
    (the error text looked for the server name a validator fills in, which the document lacks); a
    300-character name loaded, and the scheduled apply started deployment chat, then failed on
    ENAMETOOLONG under <state_dir>/deployments/, half applied."""
    spec = multi.spec_path
    text = spec.read_text()
    assert "[deployments.draft" in text
    spec.write_text(text.replace("[deployments.draft", f"[deployments.{HOSTILE_NAMES[label]}"))
    line = next(
        n
        for n, ln in enumerate(spec.read_text().splitlines(), 1)
        if "[deployments." in ln and HOSTILE_NAMES[label] in ln
    )
    run = multi.cli("apply", "--scheduled")
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "internal error" not in output and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert re.match(rf"reconcile: {re.escape(str(spec))}:{line}: deployments\.", last), output
    assert not (multi.state_dir / "deployments").exists(), "refused at load: nothing applied"
    for port in multi.ports.values():  # no server was started
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def _demo_spec(root: Path) -> Path:
    """specs/cpu-demo.toml with every path under `root` (nothing is applied: the lock is read first)."""
    text = (REPO / "specs" / "cpu-demo.toml").read_text().replace("/tmp/reconcile-demo", str(root))
    text = text.replace("{spec_dir}/demo-model", str(DEMO_MODEL))
    text = text.replace("{spec_dir}/../tests/fakes/vllm", str(FAKE_VLLM))
    spec = root / "spec" / "demo.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text(text)
    return spec


DAMAGED_LOCKS: dict[str, Any] = {
    "packages a list": {"packages": ["vllm"]},
    "a package a string": {"packages": {"ninja": "1.11"}},
    "a package without version": {"packages": {"ninja": {"specifier": "*"}}},
    "the model a string": {"model": "main"},
    "the model without commit": {"model": {"repo": "a/b", "revision": "main"}},
    # a version that is a second requirement-file line: an index of the lock editor's choosing
    "a version with a line break": {
        "packages": {"ninja": {"specifier": "*", "version": "1.11\n--index-url http://127.0.0.1:9/"}}
    },
    "a commit that is a branch": {"model": {"repo": "a/b", "revision": "main", "commit": "../main"}},
}


@pytest.mark.parametrize("label", sorted(DAMAGED_LOCKS))
def test_a_damaged_lock_is_one_error_naming_it_not_a_crash(tmp_path: Path, label: str) -> None:
    """The lock decides what root installs, and every plan and scheduled apply reads it. main: only its
    closure lines were checked; a wrong type anywhere else was `internal error: AttributeError` (or
    KeyError) on every run; a version with a newline became the spec's pin, shown raw by the plan."""
    spec = _demo_spec(tmp_path)
    lock = spec.with_suffix(".lock")
    lock.write_text(json.dumps({"format": "reconcile-lock/2", **DAMAGED_LOCKS[label]}, indent=2) + "\n")
    for command in (["plan"], ["apply", "--scheduled"]):
        run = subprocess.run(
            [sys.executable, "-m", "reconcile", *command, "--spec", str(spec)],
            capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
        )  # fmt: skip
        output = run.stdout + run.stderr
        assert run.returncode != 0, output
        assert "internal error" not in output and "Traceback" not in output, output
        assert re.search(rf"^reconcile: {re.escape(str(lock))}:\d+: .*reconcile lock", output, re.M), output
        assert "--index-url" not in output, output
        assert not (tmp_path / "state").exists(), "refused before anything was applied"


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def _wait(done: Any, what: str, bound: float = 120.0) -> None:
    import time

    limit = time.monotonic() + bound  # a generous bound on a wait for an event, not a timing
    while not done():
        assert time.monotonic() < limit, f"gave up waiting for {what}"
        time.sleep(0.05)


@root_only
def test_the_key_never_reaches_a_listener_that_took_the_port_while_vllm_bench_serve_started(
    demo: Demo, strangers: list[int]
) -> None:
    """bench checks the port's listeners before each row, then runs `vllm bench serve` with the key in
    its environment. Real vLLM's CLI takes ~10 s to import before its first connection; should the
    server die then (a crash, an OOM under the concurrent row), a local user who binds the port gets
    every request of the row, each with `Authorization: Bearer <key>`. The wrapper below holds that
    window open until the test says go (ordering, not timing). main: the spy got the key."""
    gate, go = demo.root / "bench-started", demo.root / "go"
    wrapper = demo.root / "bin" / "vllm"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = bench ]; then : > {gate}; while [ ! -e {go} ]; do sleep 0.05; done; fi\n'
        f'exec {FAKE_VLLM} "$@"\n'
    )
    wrapper.chmod(0o755)

    def edit(doc: Any) -> None:
        doc["server"]["executable"] = str(wrapper)
        doc["server"]["args"]["max-num-seqs"] = 8

    demo.write_spec(edit)
    assert demo.cli("apply").returncode == 2
    key = demo.key_file.read_text().strip()
    bench = demo.start("bench")
    _wait(gate.exists, "vllm bench serve to start")
    from actions import supervising

    supervising.stop_marked(demo.scope(), timeout=10.0)  # the server dies
    _wait(lambda: socket.socket().connect_ex(("127.0.0.1", demo.port)) != 0, "the port to be free")
    spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(demo.port)], {}, strangers)
    go.touch()
    run = demo.finish(bench, timeout=300)
    got = received(spy)
    assert key not in got and "authorization" not in got.lower(), got
    assert run.returncode != 0 and "Traceback" not in run.output, run.output
    assert "not sent there" in run.stderr, run.output


@root_only
def test_reconcile_lock_never_runs_a_venv_python_that_nobody_can_replace(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`[venv].python` in a directory nobody owns (the spec is root's; the path it names is not).
    apply holds it to the exec role (actions.venv._trusted_python); `reconcile lock` asked it for its
    version (and handed it to `uv pip compile --python`) without that check. main: nobody's program
    ran as uid 0."""
    spec = _demo_spec(tmp_path)
    import shutil
    import tempfile

    outside = Path(tempfile.mkdtemp(prefix="hostile4-"))  # root's, 0755: nobody reaches their own dir
    request.addfinalizer(lambda: shutil.rmtree(outside, ignore_errors=True))
    outside.chmod(0o755)
    theirs = outside / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    proof = theirs / "ran-as"
    program = f'#!/bin/sh\nid -u > {proof}\nexec /usr/bin/python3 "$@"\n'
    subprocess.run(
        [*AS_NOBODY, "/bin/sh", "-c", f"cat > {theirs}/python3 && chmod 755 {theirs}/python3"],
        input=program, text=True, check=True,
    )  # fmt: skip
    text = spec.read_text()
    assert "[venv]\n" in text
    spec.write_text(text.replace("[venv]\n", f'[venv]\npython = "{theirs}/python3"\n', 1))
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", "lock", "--spec", str(spec)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert not proof.exists(), f"nobody's python ran as uid {proof.read_text().strip()}: {output}"
    assert run.returncode == 1 and "Traceback" not in output, output
    assert "[venv].python" in output, output
    assert not spec.with_suffix(".lock").exists()


EVIL_BACKEND = """\
import os
open({proof!r}, "w").write(str(os.getuid()))
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(directory, config_settings=None):
    info = os.path.join(directory, "ninja-99.0.dist-info")
    os.makedirs(info)
    open(os.path.join(info, "METADATA"), "w").write("Metadata-Version: 2.1\\nName: ninja\\nVersion: 99.0\\n")
    return "ninja-99.0.dist-info"
"""


@root_only
def test_reconcile_lock_never_reads_a_wheelhouse_that_nobody_can_write(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`[venv].wheelhouse` owned by nobody: plan and apply refuse it (the read role), but `reconcile
    lock` ran `uv pip compile --find-links` on it, and uv builds an sdist to learn its metadata, running
    its build backend (an in-tree one: `backend-path = ["."]`, nothing to fetch) as root. main: nobody's
    backend ran as uid 0."""
    import shutil
    import tarfile
    import tempfile

    spec = _demo_spec(tmp_path)
    outside = Path(tempfile.mkdtemp(prefix="hostile4-"))
    request.addfinalizer(lambda: shutil.rmtree(outside, ignore_errors=True))
    outside.chmod(0o755)
    wheelhouse, proof = outside / "wheels", outside / "wheels" / "ran-as"
    wheelhouse.mkdir()
    os.chown(wheelhouse, NOBODY, NOBODY)
    source = tmp_path / "ninja-99.0"
    source.mkdir()
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evil"\nbackend-path = ["."]\n'
    )
    (source / "evil.py").write_text(EVIL_BACKEND.format(proof=str(proof)))
    with tarfile.open(tmp_path / "ninja-99.0.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="ninja-99.0")
    sdist = (tmp_path / "ninja-99.0.tar.gz").read_bytes()
    subprocess.run(
        [*AS_NOBODY, "/bin/sh", "-c", f"cat > {wheelhouse}/ninja-99.0.tar.gz"], input=sdist, check=True
    )
    text = spec.read_text()
    spec.write_text(text.replace("[venv]\n", f'[venv]\nwheelhouse = "{wheelhouse}"\n', 1))
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", "lock", "--spec", str(spec)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert not proof.exists(), f"nobody's build backend ran as uid {proof.read_text()}: {output}"
    assert run.returncode == 1 and "Traceback" not in output, output
    assert f"[venv].wheelhouse {wheelhouse}" in output, output
    assert not spec.with_suffix(".lock").exists()


def _realizations(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.endswith("-venv")) if store.is_dir() else []


def test_gc_of_one_deployment_never_removes_what_another_deployments_generations_use(multi: Multi) -> None:
    """Several deployments share one [venv] store. `reconcile gc --deployment chat` looked only at
    chat's generations (and took chat's own apply lock, not the machine's): draft's realization, which
    no process ran from while draft was stopped, was removed under draft's current generation, its
    venv link left dangling. main: removed."""
    store = multi.root / "store"

    def edit(doc: Any, running: bool = True) -> None:
        doc["venv"]["store"] = str(store)
        import tomlkit

        venv = tomlkit.table()
        venv.update(
            {
                "path": str(multi.root / "venv-draft"),
                "store": str(store),
                "system_site_packages": True,  # other inputs: its own realization
                "packages": {"ninja": "*"},
            }
        )
        doc["deployments"]["draft"]["venv"] = venv
        doc["deployments"]["draft"]["server"]["running"] = running

    multi.write(edit)
    first = multi.cli("apply", "--auto-approve")
    assert first.returncode == 2, first.stdout + first.stderr
    both = _realizations(store)
    assert len(both) == 2, both
    draft_target = os.path.realpath(multi.root / "venv-draft")
    multi.write(lambda doc: edit(doc, running=False))  # draft stopped: no process runs from its venv
    stopped = multi.cli("apply", "--auto-approve")
    assert stopped.returncode in (0, 2), stopped.stdout + stopped.stderr
    gc = multi.cli("gc", "--deployment", "chat", "--keep", "0")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert _realizations(store) == both, gc.stdout
    assert os.path.isdir(draft_target), gc.stdout


@root_only
@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_front_haproxy_that_nobody_can_replace_is_refused_before_root_runs_it(
    demo: Demo, request: pytest.FixtureRequest, command: str
) -> None:
    """`[front] haproxy` (merged with issue 30, beside the five this round read) is an exec path
    that was missing from reconcile.spec.roles.PATHS, so the preflight's path rule never looked at
    it, and actions.haproxy runs it by name. main: plan and apply said nothing of it, and apply ran
    nobody's program as uid 0."""
    import shutil
    import tempfile

    outside = Path(tempfile.mkdtemp(prefix="hostile4-"))
    request.addfinalizer(lambda: shutil.rmtree(outside, ignore_errors=True))
    outside.chmod(0o755)
    theirs = outside / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    proof = theirs / "ran-as"
    subprocess.run(
        [*AS_NOBODY, "/bin/sh", "-c", f"cat > {theirs}/haproxy && chmod 755 {theirs}/haproxy"],
        input=f"#!/bin/sh\nid -u > {proof}\nexit 0\n", text=True, check=True,
    )  # fmt: skip
    spec = demo.write_spec()
    spec.write_text(spec.read_text() + f'\n[front]\nhaproxy = "{theirs}/haproxy"\n')
    run = demo.cli(command, *["--auto-approve"] * (command == "apply"), timeout=300)
    assert not proof.exists(), f"nobody's haproxy ran as uid {proof.read_text().strip()}: {run.output}"
    assert f"[front].haproxy {theirs}/haproxy: {theirs} is owned by nobody" in run.output, run.output
