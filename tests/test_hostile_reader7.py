"""Issue 24's hostile reader, seventh round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what the sixth round's fixes added (the tools' namespaces
in the environment, the value role on `[server] env`/`args`, the `.pth` directory checks, the sealed
realization's exemption), found by reading docs/security.md and the code alone, each run for real (a
`nobody` directory, real files, the real CLI and uv), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in, seed_venv
from tests.ownership_support import nobodys_dir
from tests.test_hostile_reader6 import _nobodys_uv_config


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo with a venv made by a real apply, copied."""
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = pwd.getpwnam("nobody").pw_gid


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", *args],
        capture_output=True, text=True, timeout=180, cwd=cwd, env={**os.environ, **env},
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


# --- class 1: the path-trust layer (the environment root's tools read) ------------------------------


def test_a_relative_entry_in_xdg_config_dirs_never_hands_roots_uv_nobodys_config(
    tmp_path: Path, outside: Path
) -> None:
    """The sixth round holds each path a tool's variable names to the read or write-dir role, but
    only the words that look like paths: an absolute path or a file:// URL. uv reads
    `<entry>/uv/uv.toml` for each entry of $XDG_CONFIG_DIRS, a relative entry too, against its
    current directory, which reconcile makes "/" for every tool it runs: `sudo -E reconcile lock` with
    `XDG_CONFIG_DIRS=/etc/xdg:tmp/<nobody's dir>` hands root's uv nobody's config, which
    chooses its cache (there: a link into a root-only directory), its indexes, its overrides. main:
    uv wrote its cache, as root, into the root-only directory nobody's config named."""
    theirs, target, spec = _nobodys_uv_config(tmp_path, outside)
    relative = str(theirs.relative_to("/"))  # var/tmp/reconcile-yard-.../xdg: what it names from "/"
    env = {"XDG_CONFIG_DIRS": f"/etc/xdg:{relative}"}
    code, output = _cli("lock", "--spec", str(spec), cwd=outside, env=env)
    assert sorted(p.name for p in target.iterdir()) == [], output
    assert code == 1, output  # the wheelhouse is empty: no closure, said in one line
    assert f"reconcile: environment XDG_CONFIG_DIRS left out: /etc/xdg:{relative}" in output, output
    assert "Traceback" not in output, output


def test_a_relative_cache_dir_in_the_specs_server_env_is_refused(demo: Demo, outside: Path) -> None:
    """The value role holds each absolute path in `[server] env` to the environment's rule, but a
    relative one passed as a word: root's server runs in "/", so `VLLM_CACHE_ROOT = "tmp/<nobody's
    dir>"` is nobody's directory all the same, and a link there sends the compile cache root's server
    writes (and later loads: torch.compile's artifacts are code) where nobody chooses. main: root's
    server wrote its compile cache through nobody's link into a root-only directory."""
    theirs = nobodys_dir(outside, "vllm-cache")
    target = outside / "root-only"
    target.mkdir(mode=0o700)
    os.symlink(target, theirs / "torch_compile_cache")
    os.lchown(theirs / "torch_compile_cache", NOBODY, NOGROUP)
    relative = str(theirs.relative_to("/"))

    def edit(doc: Any) -> None:
        doc["server"]["env"]["VLLM_CACHE_ROOT"] = relative

    run = demo.cli("apply", spec=demo.write_spec(edit))
    assert sorted(p.name for p in target.iterdir()) == [], f"root's server wrote there: {run.output}"
    assert "[server].env.VLLM_CACHE_ROOT" in run.output and "owned by nobody" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_path_inside_a_json_flags_table_in_server_args_is_held_to_the_value_role(
    demo: Demo, outside: Path
) -> None:
    """`[server] args` takes a table for a JSON flag (`compilation-config = { cache_dir = ... }`, which
    vLLM hands to torch.compile as its cache directory), and the value role walked a flag's string or
    list only: the table's strings were never looked at, so a cache dir of nobody's passed the plan
    (apply then starts root's vLLM writing and loading compiled code there). main: the plan said
    nothing about it."""
    theirs = nobodys_dir(outside, "compile-cache")

    def edit(doc: Any) -> None:
        doc["server"]["args"]["compilation-config"] = {"level": 3, "options": {"cache_dir": str(theirs)}}

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert "[server].args.compilation-config" in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_a_path_after_an_equals_sign_in_a_server_value_is_held_to_the_value_role(
    demo: Demo, outside: Path
) -> None:
    """The value role took each ':'- or blank-separated word that starts with '/' as a path; a word
    like `--download-dir=/x` or `cache_dir=/x,y=z` (the form `VLLM_*` lists and `--override-*` flags
    use) starts with something else, so the path in it passed unchecked. main: the plan said nothing
    about nobody's directory in `[server] env`."""
    theirs = nobodys_dir(outside, "downloads")

    def edit(doc: Any) -> None:
        doc["server"]["env"]["VLLM_EXTRA_FLAGS"] = f"--download-dir={theirs},--seed=1"

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert "[server].env.VLLM_EXTRA_FLAGS" in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_an_apt_config_of_nobodys_never_chooses_what_roots_apt_installs(demo: Demo, outside: Path) -> None:
    """The tools' namespaces held uv's, pip's, git's, the hub's and Python's variables, but apt (which
    apply runs as root: `apt-cache policy`, `apt-get install`) takes its whole configuration from the
    file $APT_CONFIG names: its sources (a `[trusted=yes]` repository of nobody's), its lists, its
    `Dir::Bin::dpkg`, its hooks (`DPkg::Pre-Invoke`). `sudo -E reconcile apply` with nobody's file
    there installs nobody's package, whose maintainer scripts run as root. main: root's apply
    installed nobody's package (6.6.6, from nobody's repository)."""
    from tests import debs

    if missing := debs.missing_tools():
        pytest.skip(f"needs {', '.join(missing)}")
    theirs = nobodys_dir(outside, "apt")
    repo = theirs / "repo"
    repo.mkdir()
    debs.build_deb(str(repo), "reconcile-test-evil", "6.6.6")
    debs.scan(str(repo))
    for d in ("lists/partial", "cache/archives/partial", "parts"):
        (theirs / d).mkdir(parents=True)
    (theirs / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    conf = theirs / "apt.conf"
    conf.write_text(
        f'Dir::Etc::sourcelist "{theirs}/sources.list";\nDir::Etc::sourceparts "{theirs}/parts";\n'
        f'Dir::State::lists "{theirs}/lists/";\nDir::Cache "{theirs}/cache/";\nDebug::NoLocking "true";\n'
        'APT::Sandbox::User "nobody";\n'
    )
    subprocess.run(["chown", "-R", "nobody:nogroup", str(theirs)], check=True)
    update = subprocess.run(  # nobody fills their own lists: no root needed
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "apt-get", "update"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "APT_CONFIG": str(conf)},
    )  # fmt: skip
    assert update.returncode == 0, update.stderr

    def edit(doc: Any) -> None:
        doc["apt"] = {"packages": ["reconcile-test-evil"]}

    try:
        run = demo.cli("apply", spec=demo.write_spec(edit), env={"APT_CONFIG": str(conf)})
        installed = debs.installed_version("reconcile-test-evil")
    finally:
        debs.purge(["reconcile-test-evil"])
    assert installed is None, f"root's apt installed nobody's package {installed}: {run.output}"
    assert f"reconcile: environment APT_CONFIG left out: {conf}" in run.output, run.output
    assert "Traceback" not in run.output, run.output


# --- class 2: untrusted files (what the plan reads before any check) --------------------------------


def test_a_huge_pth_file_of_nobodys_in_the_venv_never_takes_the_plans_memory(seeded: Demo) -> None:
    """The sixth round refuses a venv whose site-packages holds a file of nobody's (a venv copied in
    with its owners kept), but that finding comes from the preflight, after the venv probe has read
    every `.pth` there line by line with no bound: nobody grows their own `.pth` to a sparse 4 GiB
    with no newline (no disk used) and root's plan reads it into one string. Run here under a 2 GiB
    address-space limit so the test is safe. main: the plan died of MemoryError (a traceback, no
    plan), and on a machine without the limit root's timer takes gigabytes."""
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    pth = site / "theirs.pth"
    with open(pth, "wb") as f:
        f.truncate(4 << 30)  # sparse: one line of zeros, no block written
    os.chown(pth, NOBODY, NOGROUP)
    argv = ["prlimit", f"--as={2 << 30}", "--", *seeded.command("plan")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=seeded.env())
    output = run.stdout + run.stderr
    assert "MemoryError" not in output and "Traceback" not in output, output[-3000:]
    assert str(pth) in output and "owned by nobody" in output, output[-3000:]
    assert run.returncode == 1, output[-3000:]


def test_a_fifo_for_pyvenv_cfg_in_a_venv_of_nobodys_never_hangs_the_plan(seeded: Demo) -> None:
    """A venv copied in with its owners kept is refused by the preflight (the write-dir role on
    `[venv] path`, the read role on its site-packages), but the venv probe runs first and opened
    `pyvenv.cfg` by name, blocking: in a venv directory of nobody's, nobody puts a FIFO there and
    root's plan (and the timer's apply, holding the lock) waits on it for ever. main: the plan was
    still waiting at the test's bound."""
    os.chown(seeded.venv, NOBODY, NOGROUP)
    cfg = seeded.venv / "pyvenv.cfg"
    cfg.unlink()
    os.mkfifo(cfg)
    os.chown(cfg, NOBODY, NOGROUP)
    try:
        run = subprocess.run(
            seeded.command("plan"), capture_output=True, text=True, timeout=60, env=seeded.env()
        )
    except subprocess.TimeoutExpired:
        pytest.fail("root's plan is waiting on nobody's FIFO")
    output = run.stdout + run.stderr
    assert "FIFO" in output and "Traceback" not in output, output[-3000:]
    assert "owned by nobody" in output and run.returncode == 1, output[-3000:]


def test_a_huge_metadata_file_of_nobodys_in_the_venv_never_takes_the_plans_memory(seeded: Demo) -> None:
    """The `.pth` attack's sibling: the venv probe reads each distribution's METADATA header line by
    line, unbounded, before the preflight refuses a venv holding nobody's files: nobody grows their
    own METADATA to a sparse 4 GiB line. Under a 2 GiB address-space limit. main: MemoryError."""
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    meta = site / "theirs-1.0.dist-info" / "METADATA"
    meta.parent.mkdir()
    with open(meta, "wb") as f:
        f.truncate(4 << 30)
    os.chown(meta, NOBODY, NOGROUP)
    argv = ["prlimit", f"--as={2 << 30}", "--", *seeded.command("plan")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=seeded.env())
    output = run.stdout + run.stderr
    assert "MemoryError" not in output and "Traceback" not in output, output[-3000:]
    assert str(meta) in output and "owned by nobody" in output, output[-3000:]
    assert run.returncode == 1, output[-3000:]
