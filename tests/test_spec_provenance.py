"""Issue 24, class 3: the spec's own provenance, attacked by another local user (`nobody`).

The spec, each `extends` base and the lock file decide what root runs (`[venv] python`,
`[server] executable`, the pinned versions). Each test lets `nobody` (a real process, setpriv)
write where it can, then runs the real CLI as root, as the timer would: `nobody`'s value must not
reach the plan, and no code of theirs may run. `reconcile validate` on a fleet repository reads
nothing outside it and prints nothing of what lies there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")
REPO = Path(__file__).resolve().parent.parent
MARKER = "outside-marker-7f3a9c"  # a value of a file outside the fleet repository


@pytest.fixture
def theirs(yard: Path) -> Path:
    """A directory of nobody's, holding nobody's "python": run as root, it records its uid."""
    path = yard / "theirs"
    path.mkdir()
    os.chown(path, NOBODY, NOBODY)
    script = f"#!/bin/sh\nid -u > {path}/ran-as\nexit 1\n"
    nobody_runs(f"cat > {path}/python <<'EOF'\n{script}EOF\nchmod 755 {path}/python")
    return path


def nobody_runs(script: str) -> None:
    subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c", script],
        check=True,
        cwd="/",
        timeout=30,
    )


def spec_text(yard: Path, python: str = "/usr/bin/python3") -> str:
    return f'[machine]\nstate_dir = "{yard}/state"\n\n[venv]\npath = "{yard}/venv"\npython = "{python}"\n'


def cli(yard: Path, *args: str, spec: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "reconcile", *args, *(["--spec", str(spec)] if spec else [])]
    env = {**os.environ, "XDG_CACHE_HOME": str(yard / "cache")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=yard, env=env)


def refused(run: subprocess.CompletedProcess[str], *words: str, fix: bool = True) -> str:
    """One line on stderr, exit 1, naming what is wrong (and the fix); nothing of the plan."""
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert run.stdout == "" and len(run.stderr.splitlines()) == 1, out
    for word in words:
        assert word in run.stderr, out
    assert not fix or ("chown" in run.stderr and "chmod" in run.stderr and "move" in run.stderr), out
    return run.stderr


def test_a_spec_nobody_can_swap_is_refused_and_nobodys_python_never_runs(yard: Path, theirs: Path) -> None:
    spec = theirs / "spec.toml"
    spec.write_text(spec_text(yard))  # root's own spec, but in nobody's directory
    refused(cli(yard, "plan", spec=spec), f"{theirs} is owned by nobody")
    # nobody may rename root's file in their directory and put their own in its place
    swapped = spec_text(yard, f"{theirs}/python")
    nobody_runs(f"mv {spec} {theirs}/was.toml && cat > {spec} <<'EOF'\n{swapped}EOF")
    # old code: the plan said "create .../venv with .../theirs/python", exit 2, and apply ran it as root
    refused(cli(yard, "plan", spec=spec), str(spec), "owned by nobody")
    refused(cli(yard, "apply", "--auto-approve", spec=spec), "owned by nobody")
    assert not (theirs / "ran-as").exists()  # old code: "0"
    assert not (yard / "venv").exists()


def test_a_spec_others_can_write_is_refused_even_on_a_cache_hit(yard: Path, theirs: Path) -> None:
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard))
    assert cli(yard, "plan", spec=spec).returncode == 2  # planned, and kept in the spec cache
    spec.chmod(0o666)
    refused(cli(yard, "plan", spec=spec), str(spec), "writable by others (mode 0666)")
    nobody_runs(f"echo '{spec_text(yard, f'{theirs}/python')}' > {spec}")
    refused(cli(yard, "apply", "--auto-approve", spec=spec), str(spec), "writable by others")
    assert not (theirs / "ran-as").exists()  # old code: "0"


@pytest.mark.parametrize("where", ["a 0666 file", "nobody's file", "a file in nobody's directory"])
def test_a_base_nobody_can_write_is_refused(yard: Path, theirs: Path, where: str) -> None:
    base = theirs / "base.toml" if where == "a file in nobody's directory" else yard / "base.toml"
    base.write_text(f'[venv]\npath = "{yard}/venv"\n')
    if where == "a 0666 file":
        base.chmod(0o666)
    else:
        os.chown(base, NOBODY, NOBODY)
    spec = yard / "spec.toml"
    spec.write_text(f'extends = "{os.path.relpath(base, yard)}"\n\n[machine]\nstate_dir = "{yard}/state"\n')
    nobody_runs(f"echo 'python = \"{theirs}/python\"' >> {base}")
    # old code: the plan said "create .../venv with .../theirs/python", exit 2
    run = cli(yard, "plan", spec=spec)
    refused(run, f"reconcile: {base}: ")
    assert f"{theirs}/python" not in run.stderr
    refused(cli(yard, "apply", "--auto-approve", spec=spec))
    assert not (theirs / "ran-as").exists()


def test_the_hostname_spec_in_a_specs_dir_of_nobodys_is_refused(yard: Path, theirs: Path) -> None:
    specs = yard / "specs"
    specs.mkdir()
    os.chown(specs, NOBODY, NOBODY)
    found = specs / f"{socket.gethostname()}.toml"
    nobody_runs(f"cat > {found} <<'EOF'\n{spec_text(yard, f'{theirs}/python')}EOF")
    # old code: `reconcile plan` (no --spec) planned nobody's spec: "... with .../theirs/python", exit 2
    refused(cli(yard, "plan"), f"specs/{found.name}", f"{specs} is owned by nobody")
    refused(cli(yard, "apply", "--auto-approve"), "owned by nobody")
    assert not (theirs / "ran-as").exists()


def test_a_symlink_is_followed_only_where_nobody_else_can_change_it(yard: Path, theirs: Path) -> None:
    nobody_runs(f"cat > {theirs}/own.toml <<'EOF'\n{spec_text(yard, f'{theirs}/python')}EOF")
    # nobody's link at the spec path, in their directory: the swap the directory rule is about
    nobody_runs(f"ln -s {theirs}/own.toml {theirs}/spec.toml")
    refused(cli(yard, "plan", spec=theirs / "spec.toml"), "owned by nobody")
    # root's own link (in root's directory) to a file of nobody's, and a directory link to theirs
    (yard / "link.toml").symlink_to(theirs / "own.toml")
    refused(cli(yard, "plan", spec=yard / "link.toml"), "owned by nobody")
    (yard / "dirlink").symlink_to(theirs)
    refused(cli(yard, "plan", spec=yard / "dirlink" / "own.toml"), "owned by nobody")
    # nobody's link in /tmp (sticky, world-writable) to root's good spec: they may repoint it
    (yard / "good").mkdir()
    (yard / "good" / "spec.toml").write_text(spec_text(yard))
    planted = Path(tempfile.mktemp(prefix="reconcile-provenance-", suffix=".toml", dir="/tmp"))
    nobody_runs(f"ln -s {yard}/good/spec.toml {planted}")
    try:
        refused(cli(yard, "plan", spec=planted), "/tmp is world-writable")
    finally:
        planted.unlink()
    # root's link to nobody's link to root's good spec: the end is root's, but nobody may repoint the hop
    nobody_runs(f"ln -s {yard}/good/spec.toml {theirs}/hop.toml")
    (yard / "chain.toml").symlink_to(theirs / "hop.toml")
    refused(cli(yard, "plan", spec=yard / "chain.toml"), f"{theirs} is owned by nobody")
    # a link of root's, in root's directory, to root's spec: followed
    (yard / "mine.toml").symlink_to(yard / "good" / "spec.toml")
    ok = cli(yard, "plan", spec=yard / "mine.toml")
    assert ok.returncode == 2, ok.stdout + ok.stderr
    assert "/usr/bin/python3" in ok.stdout
    assert not (theirs / "ran-as").exists()


def test_a_fifo_or_a_huge_file_is_not_a_spec(yard: Path) -> None:
    fifo = yard / "fifo.toml"
    os.mkfifo(fifo)
    refused(cli(yard, "plan", spec=fifo), str(fifo), "not a regular file", fix=False)
    huge = yard / "huge.toml"
    huge.write_text(spec_text(yard) + "#" * (2 << 20) + "\n")
    refused(cli(yard, "plan", spec=huge), str(huge), "larger than 1 MiB", fix=False)


def test_a_lock_file_nobody_can_write_is_refused(yard: Path, theirs: Path) -> None:
    spec = yard / "spec.toml"
    spec.write_text(
        f'[machine]\nstate_dir = "{yard}/state"\n\n[venv]\npath = "{yard}/venv"\n'
        'packages = { ninja = ">=1.0" }\n'
    )
    lock = yard / "spec.lock"
    lock.write_text("")
    lock.chmod(0o666)
    body = (
        '{"format": "reconcile-lock/1", "spec": "spec.toml", "model": null,'
        ' "packages": {"ninja": {"specifier": ">=1.0", "version": "6.6.6", "from": "nobody"}}}'
    )
    nobody_runs(f"echo '{body}' > {lock}")
    # old code: the plan installed nobody's pin, "ninja==6.6.6", exit 2
    run = cli(yard, "plan", spec=spec)
    refused(run, str(lock), "writable by others")
    assert "6.6.6" not in run.stderr
    os.chown(lock, NOBODY, NOBODY)
    lock.chmod(0o644)
    refused(cli(yard, "plan", spec=spec), str(lock), "owned by nobody")


def test_a_user_may_plan_their_own_spec(yard: Path, theirs: Path) -> None:
    """Not root: the spec is the user's own, in their own directory (root's above it)."""
    text = f'[machine]\nstate_dir = "{theirs}/state"\n\n[venv]\npath = "{theirs}/venv"\n'
    nobody_runs(f"cat > {theirs}/spec.toml <<'EOF'\n{text}EOF")
    run = subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            sys.executable,
            "-m",
            "reconcile",
            "plan",
            "--spec",
            f"{theirs}/spec.toml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**os.environ, "XDG_CACHE_HOME": f"{theirs}/cache", "HOME": str(theirs)},
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"create {theirs}/state/store/" in run.stdout  # the store by default (issue 26)


def fleet(yard: Path) -> Path:
    """A fleet repository (a git work tree) and, beside it, a file it must not read."""
    repo = yard / "fleet"
    (repo / ".git").mkdir(parents=True)
    (repo / "specs").mkdir()
    (yard / "outside.toml").write_text(f'[machine]\nstate_dir = "{MARKER}"\n')
    (yard / "broken.toml").write_text(f"{MARKER} = 1\n{MARKER} = 2\n")
    (yard / "outside.lock").write_text(
        f'{{"format": "reconcile-lock/1", "packages": {{"x": {{"specifier": "{MARKER}", "version": 1}}}}}}'
    )
    return repo


def test_validate_reads_nothing_outside_the_repository_and_prints_none_of_it(yard: Path) -> None:
    repo = fleet(yard)
    specs = repo / "specs"
    head = '[machine]\ndescription = "a fleet host"\n'
    (specs / "up.toml").write_text('extends = "../../outside.toml"\n' + head)
    (specs / "absolute.toml").write_text(f'extends = "{yard}/broken.toml"\n' + head)
    (specs / "base-link.toml").symlink_to(yard / "outside.toml")
    (specs / "through-link.toml").write_text('extends = "base-link.toml"\n' + head)
    (specs / "spec-link.toml").symlink_to(yard / "broken.toml")
    (specs / "locked.toml").write_text(head)
    (specs / "locked.lock").symlink_to(yard / "outside.lock")
    (specs / "inside.toml").write_text('extends = "../specs/shared/base.toml"\n')
    (specs / "shared").mkdir()
    (specs / "shared" / "base.toml").write_text(head)
    os.mkfifo(specs / "pipe.toml")  # old code: validate waited on it forever
    for where in (repo, specs):  # the git top level; the directory given when it is not in git
        if where == specs:
            shutil.rmtree(repo / ".git")
        argv = [sys.executable, "-m", "reconcile", "validate", str(specs)]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out
        assert MARKER not in out, out  # old code: `server.port: "outside-marker-7f3a9c" is not ...`
        lines = run.stdout.splitlines()
        for name in ("up", "absolute", "through-link", "spec-link", "locked"):
            line = next(x for x in lines if x.startswith(f"{specs / name}."))
            assert f"outside the repository {where}" in line, (name, out)
        assert f"{specs / 'inside.toml'}: ok" in lines, out
        assert any(x.startswith(f"{specs / 'pipe.toml'}: is not a regular file") for x in lines), out


def test_validate_reads_no_model_file_outside_the_repository(yard: Path) -> None:
    """The preflight reads a local source's config: one outside the repository (by its path, or a
    link in the source that leads out) gives no number of its own to any finding."""
    repo = fleet(yard)
    model = yard / "outside-model"
    shutil.copytree(REPO / "specs" / "demo-model", model)
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        (model / name).write_text((model / name).read_text().replace(f'"{key}": 2048', f'"{key}": 31337'))
    demo = (REPO / "specs" / "cpu-demo.toml").read_text().replace("{spec_dir}/..", str(REPO))
    demo = demo.split("[model.config.rope_parameters]")[0] + "[api_key]" + demo.split("[api_key]")[1]
    demo = demo.replace("max-model-len = 2048", "max-model-len = 100000")
    (repo / "specs" / "by-path.toml").write_text(demo.replace("{spec_dir}/demo-model", str(model)))
    inside = repo / "specs" / "model"
    shutil.copytree(REPO / "specs" / "demo-model", inside)
    for name in ("config.json", "tokenizer_config.json"):
        (inside / name).unlink()
        (inside / name).symlink_to(model / name)
    (repo / "specs" / "by-link.toml").write_text(demo.replace("{spec_dir}/demo-model", str(inside)))
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", "validate", str(repo / "specs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    # old code: "max-model-len 100,000 is above the 31,337 vLLM (version unknown) derives (...)", twice
    assert "31,337" not in out and "31337" not in out, out
    assert "2 spec(s) checked" in out, out
