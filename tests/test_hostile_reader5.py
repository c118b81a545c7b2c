"""Issue 24's hostile reader, fifth round, classes 1-3 (the path-trust layer, untrusted trees and files,
the spec's own provenance): attacks on what was merged after the fourth (the store and its
huggingface_hub layout, `reconcile lock`, gc, validate), found by reading docs/security.md and the
code alone, each run for real (a `nobody` process or file through setpriv, real files, links, FIFOs,
git, uv), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import Demo, demo_in
from tests.ownership_support import nobodys_dir
from tests.test_untrusted_trees import Tree, tree

__all__ = ["tree"]  # the fixture: a model source tree of nobody's

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files and processes of another user)")

REPO = Path(__file__).resolve().parent.parent
NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = pwd.getpwnam("nobody").pw_gid
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
UV = str(Path(sys.executable).parent / "uv")


def _as_nobody_sh(script: str) -> None:
    subprocess.run([*AS_NOBODY, "/bin/sh", "-c", script], check=True, timeout=30)


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: str = "/", timeout: float = 180
) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


def _lock_spec(root: Path, wheelhouse: Path | None = None) -> Path:
    """A spec with only [machine] and [venv] (ninja), as `reconcile lock` reads it."""
    spec = root / "spec" / "demo.toml"
    spec.parent.mkdir(parents=True)
    house = f'wheelhouse = "{wheelhouse}"\n' if wheelhouse else ""
    spec.write_text(
        f'[machine]\nstate_dir = "{root}/state"\n\n'
        f'[venv]\npath = "{root}/venv"\npython = "/usr/bin/python3"\n{house}packages = {{ ninja = "*" }}\n'
    )
    return spec


# --- the two known holes ---------------------------------------------------------------------------


def test_gc_decides_in_use_from_reconciles_own_processes_not_a_strangers_command_line(tmp_path: Path) -> None:
    """gc kept a realization when any process on the machine named a path inside it on its command
    line (or had it as cwd or exe): nobody runs `python3 -c 'sleep' <store>/<hash>-venv` and the
    realization is never collected, the disk never reclaimed. main: kept, "a running process uses it"."""
    store = tmp_path / "store"
    doomed = store / ("a" * 32 + "-venv")
    (doomed / "bin").mkdir(parents=True)
    (doomed / "bin" / "python").write_text("")
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[machine]\nstate_dir = "{tmp_path}/state"\n\n'
        f'[venv]\npath = "{tmp_path}/venv"\nstore = "{store}"\npackages = {{ ninja = "*" }}\n'
    )
    holder = subprocess.Popen(
        [*AS_NOBODY, "/usr/bin/python3", "-c", "import time; time.sleep(300)", str(doomed / "bin" / "python")]
    )
    try:
        deadline = time.monotonic() + 30  # a bound on the wait for nobody's process to exec
        while str(doomed).encode() not in Path(f"/proc/{holder.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "nobody's process never started"
            time.sleep(0.05)
        code, output = _cli("gc", "--keep", "0", "--spec", str(spec))
        assert code == 0, output
        assert f"removed  {doomed}" in output, output
        assert not doomed.exists(), output
    finally:
        holder.kill()
        holder.wait()


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


def test_reconcile_lock_never_runs_a_build_backend_from_the_specs_own_sources(
    tmp_path: Path, outside: Path
) -> None:
    """Round 4 held the wheelhouse to the read role; but a wheelhouse (or index) root trusts may still
    hold an sdist, and uv builds an sdist to learn its metadata: its build backend ran as uid 0 at
    `reconcile lock`, before any person looked at what was resolved. A hostile or compromised index
    needs no local user at all. main: the backend ran as uid 0."""
    wheelhouse = outside / "wheels"
    wheelhouse.mkdir()  # root's, 0755: the read role passes
    proof = outside / "ran-as"
    source = tmp_path / "ninja-99.0"
    source.mkdir()
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evil"\nbackend-path = ["."]\n'
    )
    (source / "evil.py").write_text(EVIL_BACKEND.format(proof=str(proof)))
    with tarfile.open(wheelhouse / "ninja-99.0.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="ninja-99.0")
    spec = _lock_spec(tmp_path, wheelhouse)
    code, output = _cli("lock", "--spec", str(spec), env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert not proof.exists(), f"the sdist's build backend ran as uid {proof.read_text()}: {output}"
    assert code == 1 and "Traceback" not in output, output
    assert "build" in output and "ninja" in output, output
    assert not spec.with_suffix(".lock").exists()


# --- class 1: the path-trust layer ------------------------------------------------------------------


def test_a_uv_of_nobodys_in_a_root_directory_on_path_never_runs_as_root(
    tmp_path: Path, outside: Path
) -> None:
    """Round 3 held every program run by name to the exec role (host._program). `reconcile lock` and
    apply's uv installer look uv up themselves (shutil.which) and run the absolute path they found,
    which host.run passed unchecked ("a path, checked by its own role": it has none). A `uv` of
    nobody's in a root directory on PATH (a tarball unpacked with its owners) ran as uid 0.
    main: ran as uid 0."""
    bindir = outside / "bin"
    bindir.mkdir()
    proof = outside / "ran-as"
    shim = bindir / "uv"
    shim.write_text(f'#!/bin/sh\nid -u > {proof}\nexec {UV} "$@"\n')
    shim.chmod(0o755)
    os.chown(shim, NOBODY, NOGROUP)
    spec = _lock_spec(tmp_path)
    path = f"{bindir}:/usr/bin:/bin"
    env = {"PATH": path, "XDG_CACHE_HOME": str(tmp_path / "c")}
    code, output = _cli("lock", "--spec", str(spec), env=env)
    assert not proof.exists(), f"nobody's uv ran as uid {proof.read_text().strip()}: {output}"
    assert code == 1 and "Traceback" not in output, output
    assert f"{shim} is owned by nobody" in output, output


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def test_a_git_config_of_another_users_xdg_config_home_never_runs_a_program_as_root(
    demo: Demo, outside: Path
) -> None:
    """`sudo -E reconcile plan` keeps the invoker's XDG_CONFIG_HOME (and HOME): root's `git status`
    of the spec's repository (held to the spec's rule, round 1) still reads the global config from
    there, and a global config chooses programs: core.attributesFile puts a clean filter on every
    file, and git runs it to compare a touched spec with the index. The private cache already
    refuses such a directory (reconcile.private_cache); git, uv and pip were handed it.
    main: the filter ran as uid 0."""
    repo = demo.root / "repo"
    repo.mkdir()
    spec = demo.write_spec(path=repo / "demo.toml")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "demo.toml"], check=True)
    subprocess.run([*git, "commit", "-qm", "spec"], check=True)
    later = time.time() + 5
    os.utime(spec, (later, later))  # touched: git compares its content, through the clean filter
    theirs = nobodys_dir(outside, "config")
    proof = theirs / "ran-as"
    (theirs / "git").mkdir()
    (theirs / "attributes").write_text("* filter=x\n")
    (theirs / "git" / "config").write_text(
        f"[core]\n\tattributesFile = {theirs}/attributes\n"
        f'[filter "x"]\n\tclean = sh -c "id -u > {proof}; cat"\n'
    )
    for path in (theirs / "git", theirs / "attributes", theirs / "git" / "config"):
        os.chown(path, NOBODY, NOGROUP)  # nobody's files in nobody's directory
    run = demo.cli("plan", spec=spec, env={"XDG_CONFIG_HOME": str(theirs)})
    assert not proof.exists(), f"nobody's git filter ran as uid {proof.read_text().strip()}: {run.output}"
    assert run.returncode in (0, 2), run.output
    assert f"reconcile: environment XDG_CONFIG_HOME left out: {theirs}" in run.stderr, run.output


def test_a_cache_dir_of_another_users_xdg_cache_home_never_receives_roots_writes(
    tmp_path: Path, outside: Path
) -> None:
    """The same `sudo -E`: uv (run by `reconcile lock` as root) keeps its cache in $XDG_CACHE_HOME/uv:
    index pages, built wheels, the interpreter's facts, all of which it trusts on the next run. nobody
    owns that directory, so they choose where root writes (a link at `uv`) and what root reads back.
    main: uv wrote its cache, as root, into a root-only directory the link led to."""
    theirs = nobodys_dir(outside, "cache")
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    os.symlink(target, theirs / "uv")
    os.lchown(theirs / "uv", NOBODY, NOGROUP)
    spec = _lock_spec(tmp_path, outside / "no-wheels")
    (outside / "no-wheels").mkdir()
    code, output = _cli("lock", "--spec", str(spec), env={"XDG_CACHE_HOME": str(theirs)})
    assert sorted(p.name for p in target.iterdir()) == [], output
    assert code == 1, output  # the wheelhouse is empty: no closure, said in one line
    assert f"reconcile: environment XDG_CACHE_HOME left out: {theirs}" in output, output
    assert "Traceback" not in output, output


# --- class 2: untrusted trees and files ------------------------------------------------------------


def test_a_link_out_of_nobodys_source_is_never_read_to_address_the_realization(
    tree: Tree, tmp_path: Path
) -> None:
    """The copy refuses a source link that leads out of the source (round 1), and the plan's JSON reads
    judge the descriptor (round 3); but the realization's address (reconcile.apply.model_store.
    source_content, at every spec load) and the plan's drift (probes.model_source) hashed each file
    through its links wherever they led: root read a root-only file nobody named, every plan, and
    kept its sha256 in root's cache. main: the secret's sha256 was in root's cache."""
    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "token"
    secret.write_bytes(b"hf_s3cr3t-token-of-roots\n")
    secret.chmod(0o600)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    tree.as_nobody("ln", "-s", str(secret), str(tree.source / "weights.bin"))
    cache = tmp_path / "cache"
    argv = [sys.executable, "-m", "reconcile", "plan", "--spec", str(tree.spec)]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tree.root, env=env)
    output = run.stdout + run.stderr
    kept = [p for p in cache.rglob("*") if p.is_file() and digest.encode() in p.read_bytes()]
    assert kept == [], f"root hashed the file nobody's link led to: {kept}"
    assert "Traceback" not in output, output
    assert "weights.bin" in output and "outside the source" in output, output


def test_a_seal_file_in_nobodys_source_never_becomes_the_realizations_seal(tree: Tree) -> None:
    """`.reconcile-realization.json` is reconcile's own record in a realization: its seal (gc keeps the
    snapshot it names, the probe calls the model dir sealed, seal_model never writes another). The
    copy left out the download record and the config backup but not the seal, so nobody's source
    chose it: here a seal naming another repository's snapshot, which gc would keep forever, while
    the realization's own files never went to the store's blobs. main: nobody's seal, as written."""
    forged = {
        "format": "reconcile-model-realization/1",
        "repo_folder": "models--victim--model",
        "snapshot": "f" * 40,
        "files": {},
        "config_json": None,
    }
    (tree.source / ".reconcile-realization.json").write_text(json.dumps(forged))
    os.chown(tree.source / ".reconcile-realization.json", NOBODY, NOGROUP)
    run = tree.cli("apply")
    assert run.returncode == 2, run.output
    seal = json.loads((tree.copied() / ".reconcile-realization.json").read_text())
    assert seal.get("snapshot") != "f" * 40 and seal.get("repo_folder") != "models--victim--model", seal
    assert "config.json" in seal.get("files", {}), seal


# --- class 3: the spec's own provenance -----------------------------------------------------------


def _blocked_in_open(pid: int) -> bool:
    """The process is inside openat(2) (a FIFO's open for writing waits for a reader)."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == "257"
    except (OSError, IndexError):
        return False


def test_validate_never_opens_a_path_outside_the_repository(tmp_path: Path, outside: Path) -> None:
    """`validate` reads a fleet repository under review as data, and nothing outside it (round 3:
    extends, locks, the model's files). But it computed the machine rules before leaving their
    verdicts out: the path rule walks every path the spec names and opens each exec path to read its
    `#!` line (a device's open can act: /dev/watchdog arms the watchdog, a tape rewinds), and walks
    every extra_site_packages tree whole. A FIFO outside the repository stands in for the device: its
    writer (nobody, blocked in open) is released when validate opens it. main: released."""
    fifo_dir = outside / "dev"
    fifo_dir.mkdir()
    fifo = fifo_dir / "watchdog"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY, NOGROUP)
    proof = nobodys_dir(outside, "proof") / "opened"
    writer = subprocess.Popen([*AS_NOBODY, "/bin/sh", "-c", f"exec 3> {fifo}; echo yes > {proof}"])
    try:
        deadline = time.monotonic() + 30  # a bound on the wait for the writer to reach its open
        while not _blocked_in_open(writer.pid):
            assert writer.poll() is None and time.monotonic() < deadline, "the writer never blocked"
            time.sleep(0.05)
        repo = tmp_path / "fleet"
        repo.mkdir()
        text = (REPO / "specs" / "cpu-demo.toml").read_text()
        text = text.replace('executable = "{spec_dir}/../tests/fakes/vllm"', f'executable = "{fifo}"')
        assert str(fifo) in text
        (repo / "gpu-1.toml").write_text(text)
        code, output = _cli("validate", str(repo))
        assert code == 0 and "Traceback" not in output, output
        assert _blocked_in_open(writer.pid), f"validate opened {fifo}, outside the repository: {output}"
        assert not proof.exists()
    finally:
        writer.kill()
        writer.wait()


def test_gc_collects_the_snapshot_of_a_source_nested_past_the_recursion_limit(tree: Tree) -> None:
    """Round 2 copies nobody's source nested 1,100 levels deep (a/a/...) like any tree, and round 3
    removes such a realization by descriptor; but the realization's snapshot in the store's
    huggingface_hub layout is as deep, and gc's snapshot cleaning (scan_cache_dir's glob, then
    shutil.rmtree) recursed once a level. main: once that source changed, every gc ended in an
    internal error."""
    from tests.test_hostile_reader2 import DEEPEN

    tree.as_nobody(sys.executable, "-c", DEEPEN, str(tree.source))
    try:
        first = tree.cli("apply", timeout=300)
        assert first.returncode == 2, first.output
        old = tree.copied()
        tree.as_nobody("/bin/sh", "-c", f"echo y > {tree.source}/tokenizer/extra.txt")
        second = tree.cli("apply", timeout=300)
        assert second.returncode == 2, second.output
        assert tree.copied() != old
        gc = tree.cli("gc", "--keep", "0", timeout=300)
        assert gc.returncode == 0, gc.output
        assert "internal error" not in gc.output and "RecursionError" not in gc.output, gc.output
        assert f"removed  {old}" in gc.stdout, gc.output
        assert not old.exists()
        snapshots = list((tree.root / "state" / "store" / "hub").glob("models--*/snapshots/*"))
        assert len(snapshots) == 1, snapshots  # the current realization's only
    finally:  # shutil.rmtree (the fixture's) recurses too
        deep = [str(tree.source / "a"), str(tree.root / "state")]
        subprocess.run(["rm", "-rf", *deep], check=False, timeout=120)


def test_nobody_cannot_point_their_source_at_a_directory_only_root_may_read(
    tree: Tree, outside: Path
) -> None:
    """`[model] source` may be nobody's (it is data), and round 3 keeps each file of it inside the source
    as resolved at the copy. But the source path itself was resolved with realpath, links and all: a
    source in nobody's directory that nobody turns into a link to a directory only root may enter
    makes root copy that directory, as the model, into the model dir, its 0644 files 0644 (readable by
    the server's user, and by everyone where the store is readable). main: root's private file was
    copied into the realization."""
    private = outside / "root-only"
    private.mkdir(mode=0o700)
    shutil.copytree(tree.source, private / "model")
    (private / "model" / "private.txt").write_text("root's private notes\n")
    (private / "model" / "private.txt").chmod(0o644)
    theirs = nobodys_dir(outside, "home")
    tree.as_nobody("ln", "-s", str(private / "model"), str(theirs / "model"))
    tree.spec.write_text(
        tree.spec.read_text().replace(f'source = "{tree.source}"', f'source = "{theirs}/model"')
    )
    run = tree.cli("apply")
    store = tree.root / "state" / "store"
    copied = [p for p in store.rglob("private.txt")] if store.is_dir() else []
    assert copied == [], f"root copied its own private file as nobody's model: {copied}: {run.output}"
    assert run.returncode != 2 and "Traceback" not in run.output, run.output
    assert f"{theirs}/model" in run.output and "owned by nobody" in run.output, run.output
