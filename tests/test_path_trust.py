"""Issue 24, class 1: one path-trust layer. Attacks by a local user without privileges (`nobody`) on
the paths root execs, reads, writes and deletes, each seen succeeding on the code before the layer.

The attacker owns a directory on the path, or the directory that holds a symlink on it: a check of
the resolved path alone (the old `parent_problem` resolved links first) never looked at it, so the
link could be re-pointed between the preflight and the exec. Real users, links and the real CLI.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.safety.filesafety import UnsafePath, ensure_dir, open_regular, parent_problem, resolve_exec
from tests.apply_support import Demo
from tests.ownership_support import listening_as_nobody
from tests.test_server_support import FAKE_VLLM as _FAKE

FAKE_VLLM = Path(_FAKE)

NOBODY = 65534


def nobodys_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    os.chown(path, NOBODY, NOBODY)
    return path


def tattler(path: Path, mark: Path, then: str) -> None:
    """A program that writes who ran it to `mark`, then becomes `then` (so the run looks normal)."""
    path.write_text(f'#!/bin/sh\nid -u > {mark}\nexec {then} "$@"\n')
    path.chmod(0o755)


def as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv], check=True, timeout=30
    )


def test_an_executable_behind_a_link_in_nobodys_dir_never_runs_nobodys_code(seeded: Demo, yard: Path) -> None:
    theirs = nobodys_dir(yard / "theirs")
    link = theirs / "bin"
    as_nobody("ln", "-s", str(FAKE_VLLM.parent), str(link))  # at plan time: root's own fake vllm
    seeded.write_spec(lambda doc: doc["server"].__setitem__("executable", str(link / "vllm")))
    plan = seeded.cli("plan")

    # Between plan and apply, nobody points the link at a directory of its own, as itself.
    mark = seeded.root / "ran-as"
    evil = theirs / "evil"
    as_nobody("mkdir", str(evil))
    tattler(evil / "vllm", mark, str(FAKE_VLLM))  # written for nobody: root's mark file is in a 0700 dir
    os.chown(evil / "vllm", NOBODY, NOBODY)
    as_nobody("ln", "-sfn", str(evil), str(link))
    run = seeded.cli("apply")

    assert not mark.exists(), f"root ran nobody's program (uid {mark.read_text().strip()})"
    assert plan.returncode == 1, plan.output
    assert f"[server].executable {link / 'vllm'}: {theirs} is owned by nobody" in plan.output
    assert run.returncode == 1, run.output
    assert not seeded.server_pids()


def test_a_venv_python_in_nobodys_dir_is_refused_before_it_runs(demo: Demo) -> None:
    theirs = nobodys_dir(demo.root / "theirs")
    mark = demo.root / "ran-as"
    tattler(theirs / "python3", mark, sys.executable)
    os.chown(theirs / "python3", NOBODY, NOBODY)
    demo.write_spec(lambda doc: doc["venv"].__setitem__("python", str(theirs / "python3")))
    plan = demo.cli("plan")
    run = demo.cli("apply")

    assert not mark.exists(), "root ran nobody's interpreter to make the venv"
    assert plan.returncode == 1, plan.output
    assert f"[venv].python {theirs / 'python3'}: {theirs} is owned by nobody" in plan.output
    assert run.returncode == 1, run.output


def test_a_venv_python_found_on_path_is_checked_where_it_was_found(demo: Demo) -> None:
    theirs = nobodys_dir(demo.root / "theirs")
    mark = demo.root / "ran-as"
    tattler(theirs / "python3.11-evil", mark, sys.executable)
    demo.write_spec(lambda doc: doc["venv"].__setitem__("python", "python3.11-evil"))
    env = {**os.environ, "PATH": f"{theirs}:{os.environ['PATH']}"}
    plan = demo.cli("plan", env=env)
    assert not mark.exists()
    # nobody's directory is left out of PATH itself now (filesafety.search_path), and said so
    assert f"PATH entry left out: {theirs}: {theirs} is owned by nobody" in plan.output, plan.output
    assert demo.cli("apply", env=env).returncode != 0 and not mark.exists()


def test_a_textfile_in_a_sticky_world_writable_dir_leaves_that_dir_as_it_was(demo: Demo) -> None:
    sticky = demo.root / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    demo.write_spec()
    run = demo.cli("plan", "--textfile", str(sticky / "reconcile.prom"))
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1777, "reconcile chmodded a shared /tmp-like directory"
    assert run.returncode == 1, run.output
    assert f"{sticky} is world-writable" in run.output
    assert not (sticky / "reconcile.prom").exists()


def test_an_apt_key_source_swapped_for_a_link_publishes_nothing(tmp_path: Path) -> None:
    from actions.apt import add_repository
    from reconcile.errors import ReconcileError
    from reconcile.spec.models import AptRepository

    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000::::::\n")
    secret.chmod(0o600)
    theirs = nobodys_dir(tmp_path / "theirs")
    (theirs / "repo.gpg").symlink_to(secret)
    os.lchown(theirs / "repo.gpg", NOBODY, NOBODY)
    keyring = tmp_path / "keyrings" / "repo.gpg"
    repo = AptRepository(
        name="repo",
        uri="file:///srv/repo",
        suite="./",
        components=[],
        keyring=str(keyring),
        key_source=str(theirs / "repo.gpg"),
    )
    with pytest.raises(ReconcileError, match="owned by nobody"):
        add_repository(repo, str(tmp_path / "sources"))
    assert not keyring.exists(), "root copied a root-only file to a 0644 keyring"


def test_gc_never_follows_a_symlinked_store(seeded: Demo) -> None:
    other = seeded.root / "other-store"
    doomed = other / ("0" * 32 + "-venv")
    doomed.mkdir(parents=True)
    (doomed / "keep-me").write_text("another store's realization\n")
    theirs = nobodys_dir(seeded.root / "theirs")
    (theirs / "store").symlink_to(other)
    seeded.write_spec(lambda doc: doc["venv"].__setitem__("store", str(theirs / "store")))
    run = seeded.cli("gc")
    assert (doomed / "keep-me").exists(), "gc deleted through a link nobody controls"
    assert run.returncode == 1, run.output
    assert f"{theirs} is owned by nobody" in run.output


# The rule itself, on real directories and links.


def test_a_link_in_a_directory_nobody_owns_fails_even_when_its_target_is_roots(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "tool").write_text("#!/bin/sh\n")
    theirs = nobodys_dir(tmp_path / "theirs")
    (theirs / "link").symlink_to(roots)
    problem = parent_problem(str(theirs / "link" / "tool"))
    assert problem is not None and f"{theirs} is owned by nobody" in problem
    # The same link in root's own directory is fine: only root can re-point it.
    (tmp_path / "link").symlink_to(roots)
    assert parent_problem(str(tmp_path / "link" / "tool")) is None


def test_a_link_in_a_sticky_dir_counts_only_when_it_is_ours(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    target = tmp_path / "target"
    target.mkdir()
    (sticky / "mine").symlink_to(target)
    assert parent_problem(str(sticky / "mine" / "x.log")) is None
    (sticky / "theirs").symlink_to(target)
    os.lchown(sticky / "theirs", NOBODY, NOBODY)
    problem = parent_problem(str(sticky / "theirs" / "x.log"))
    assert problem is not None and "owned by nobody" in problem


def test_a_link_target_walked_with_dotdot_is_checked_on_the_way(tmp_path: Path) -> None:
    theirs = nobodys_dir(tmp_path / "theirs")
    (theirs / "sub").mkdir()
    os.chown(theirs / "sub", NOBODY, NOBODY)
    (tmp_path / "via").symlink_to("theirs/sub/..")  # resolves into nobody's directory
    problem = parent_problem(str(tmp_path / "via" / "x"))
    assert problem is not None and "owned by nobody" in problem


def test_resolve_exec_refuses_a_program_others_may_write_or_that_is_not_a_file(tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o755)
    assert resolve_exec(str(prog)) == str(prog)
    prog.chmod(0o775)
    with pytest.raises(UnsafePath, match="group-root-writable"):
        resolve_exec(str(prog))
    prog.chmod(0o755)
    os.chown(prog, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="owned by nobody"):
        resolve_exec(str(prog))
    with pytest.raises(UnsafePath, match="not a regular file"):
        resolve_exec(str(tmp_path))


def test_resolve_exec_checks_a_scripts_interpreter_too(tmp_path: Path) -> None:
    theirs = nobodys_dir(tmp_path / "theirs")
    interp = theirs / "sh"
    interp.write_text("#!/bin/sh\n")
    interp.chmod(0o755)
    prog = tmp_path / "prog"
    prog.write_text(f"#!{interp} -e\nexit 0\n")
    prog.chmod(0o755)
    with pytest.raises(UnsafePath, match=f"interpreter {interp}.*owned by nobody"):
        resolve_exec(str(prog))


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    with pytest.raises(UnsafePath, match="is a FIFO, not a regular file"):
        open_regular(str(fifo), max_bytes=4096)


def test_ensure_dir_never_changes_a_directory_it_did_not_make_shared(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(UnsafePath, match="world-writable"):
        ensure_dir(str(shared), 0o755)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_every_path_field_of_the_models_has_its_role_in_the_table() -> None:
    """reconcile.spec.roles.PATHS (read on the warm path) is exactly the models' role-typed fields."""
    import typing

    from pydantic import BaseModel

    from reconcile.spec import models, roles

    def role_in(annotation: object) -> roles.Role | None:
        for meta in getattr(annotation, "__metadata__", ()):
            if isinstance(meta, roles.Role):
                return meta
        for arg in typing.get_args(annotation):
            if (found := role_in(arg)) is not None:
                return found
        return None

    found: set[tuple[str, str, roles.Role]] = set()

    def visit(model: type[BaseModel], section: str) -> None:
        for name in model.model_fields:
            if model is models.Spec and name == "deployments":
                continue  # the same sections again (each deployment is planned as a spec of its own)
            ann = typing.get_type_hints(model, include_extras=True)[name]
            if (role := role_in(ann)) is not None:
                found.add((section, name, role))
            for arg in [
                ann,
                *typing.get_args(ann),
                *(a for x in typing.get_args(ann) for a in typing.get_args(x)),
            ]:
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    visit(arg, f"{section}.{name}" if section else name)

    visit(models.Spec, "")
    assert found == set(roles.PATHS), found ^ set(roles.PATHS)


def _full_spec(tmp_path: Path, field: tuple[str, str], bad: str) -> str:
    """A spec naming every kind of path, all in root's directories except `field`, set to `bad`."""
    ok = tmp_path / "ok"
    ok.mkdir(exist_ok=True)
    good = {
        ("machine", "state_dir"): f"{ok}/state",
        ("cuda", "home"): f"{ok}/cuda",
        ("cuda", "target"): f"{ok}/cuda-13.0",
        ("apt", "sources_dir"): f"{ok}/sources.list.d",
        ("apt.repositories", "keyring"): f"{ok}/keyrings/r.gpg",
        ("apt.repositories", "key_source"): f"{ok}/r.gpg",
        ("venv", "path"): f"{ok}/venv",
        ("venv", "python"): sys.executable,
        ("venv", "index_url"): "https://pypi.org/simple",
        ("venv", "extra_index_urls"): f"file://{ok}/simple",
        ("venv", "wheelhouse"): f"{ok}/wheels",
        ("venv", "extra_site_packages"): f"{ok}/site",
        ("venv", "store"): f"{ok}/store",
        ("model", "source"): f"{ok}/src",
        ("model", "dir"): f"{ok}/model",
        ("api_key", "file"): f"{ok}/api.key",
        ("server", "executable"): "/bin/true",
        ("server", "log"): f"{ok}/s.log",
        ("server", "pidfile"): f"{ok}/s.pid",
        ("server", "secret_files"): f"{ok}/hf.token",
        ("server", "env"): f"{ok}/vllm-cache",
        ("server", "args"): f"{ok}/template.jinja",
        ("front", "haproxy"): "/bin/true",
        ("apt.repositories", "uri"): "file:///srv/r",
    }
    good[field] = bad

    def v(section: str, name: str) -> str:
        value = good[(section, name)]
        if name in ("extra_site_packages", "extra_index_urls"):
            return f'["{value}"]'
        if name == "secret_files":
            return f'{{ HF_TOKEN = "{value}" }}'
        if name == "env":
            return f'{{ VLLM_CACHE_ROOT = "{value}" }}'
        if name == "args":
            return f'{{ chat-template = "{value}" }}'
        return f'"{value}"'

    return f"""
[machine]
state_dir = {v("machine", "state_dir")}
[cuda]
home = {v("cuda", "home")}
target = {v("cuda", "target")}
[apt]
sources_dir = {v("apt", "sources_dir")}
[[apt.repositories]]
name = "r"
uri = {v("apt.repositories", "uri")}
suite = "./"
keyring = {v("apt.repositories", "keyring")}
key_source = {v("apt.repositories", "key_source")}
[venv]
path = {v("venv", "path")}
python = {v("venv", "python")}
index_url = {v("venv", "index_url")}
extra_index_urls = {v("venv", "extra_index_urls")}
wheelhouse = {v("venv", "wheelhouse")}
extra_site_packages = {v("venv", "extra_site_packages")}
store = {v("venv", "store")}
[model]
source = {v("model", "source")}
dir = {v("model", "dir")}
[api_key]
file = {v("api_key", "file")}
[server]
name = "s"
executable = {v("server", "executable")}
log = {v("server", "log")}
pidfile = {v("server", "pidfile")}
secret_files = {v("server", "secret_files")}
env = {v("server", "env")}
args = {v("server", "args")}
[front]
haproxy = {v("front", "haproxy")}
"""


def _role_params() -> list[tuple[str, str]]:
    from reconcile.spec.roles import PATHS

    return [(section, name) for section, name, _ in PATHS]


@pytest.mark.parametrize(
    "field", _role_params(), ids=lambda f: f"{f[0]}.{f[1]}" if isinstance(f, tuple) else f
)
def test_every_path_the_spec_names_is_refused_in_nobodys_directory(
    tmp_path: Path, field: tuple[str, str], strangers: list[int]
) -> None:
    """Coverage by construction: each field of reconcile.spec.roles.PATHS, put behind nobody's
    directory (a link there for the ones root follows), is an error naming its key; `data` (a source
    tree copied as data) is the one role that may live there; a `location` (a URL) is put on a loopback
    port nobody listens on instead."""
    from reconcile.preflight.paths import path_findings
    from reconcile.spec.loader import load_spec
    from reconcile.spec.roles import PATHS

    role = {(s, n): r for s, n, r in PATHS}[field]
    theirs = nobodys_dir(tmp_path / "theirs")
    if role.kind in ("exec", "read"):  # a real thing behind a link nobody can re-point
        real = tmp_path / "real"
        real.mkdir()
        (real / "thing").write_text("#!/bin/sh\n")
        (real / "thing").chmod(0o755)
        (theirs / "link").symlink_to(real)
        bad = str(theirs / "link" / "thing")
    elif role.kind == "location":
        bad = f"http://127.0.0.1:{listening_as_nobody(strangers)}/debian"
    else:
        bad = str(theirs / "thing")
    spec = tmp_path / "spec.toml"
    spec.write_text(_full_spec(tmp_path, field, bad))
    found = [f for f in path_findings(load_spec(str(spec)).spec) if f.severity == "error"]
    key = f"[{field[0].split('.')[0]}]"
    if role.kind == "data":
        assert not any(bad in f.message for f in found), found
        return
    assert any(
        f.evidence["key"].startswith(key)
        and field[1] in f.evidence["key"]
        and (f"{theirs} is owned by nobody" in f.message or "listened on by nobody" in f.message)
        for f in found
    ), found


def test_a_link_nobody_flips_during_apply_never_gets_root_to_run_its_program(
    seeded: Demo, yard: Path
) -> None:
    """The race, as nobody runs it: the link flips between root's directory and nobody's as fast as
    `mv -T` goes, while root applies. The code before the layer checked the resolved target at plan
    time and again in apply's preflight, then exec'd the name: on 34c0b95 root ran nobody's program
    on the 10th apply (uid 0 in the mark). Now the link's own directory is nobody's: refused, always."""
    theirs = nobodys_dir(yard / "theirs")
    link, evil = theirs / "bin", theirs / "evil"
    as_nobody("mkdir", str(evil))
    mark = seeded.root / "ran-as"
    tattler(evil / "vllm", mark, str(FAKE_VLLM))
    os.chown(evil / "vllm", NOBODY, NOBODY)
    as_nobody("ln", "-s", str(FAKE_VLLM.parent), str(link))
    seeded.write_spec(lambda doc: doc["server"].__setitem__("executable", str(link / "vllm")))
    loop = (
        f"end=$(($(date +%s)+120)); while [ $(date +%s) -lt $end ]; do "
        f"ln -sfn {FAKE_VLLM.parent} {theirs}/t1 && mv -T {theirs}/t1 {link}; "
        f"ln -sfn {evil} {theirs}/t2 && mv -T {theirs}/t2 {link}; done"
    )
    flip = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c", loop]
    )
    try:
        for _ in range(6):
            run = seeded.cli("apply")
            assert run.returncode == 1 and "is owned by nobody" in run.output, run.output
            assert not mark.exists(), f"root ran nobody's program (uid {mark.read_text().strip()})"
    finally:
        flip.kill()
        flip.wait()
    assert not seeded.server_pids()


def test_a_directory_of_ours_in_a_sticky_dir_is_used_and_made_but_never_someone_elses(tmp_path: Path) -> None:
    """The demo's /tmp/reconcile-demo: ensure_dir uses our directory in a sticky one and makes a new
    one there; a name nobody made first is refused, and a file is never made directly in it."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    ensure_dir(str(sticky / "ours"), 0o755)  # made
    ensure_dir(str(sticky / "ours"), 0o755)  # and used
    assert (sticky / "ours").is_dir() and (sticky / "ours").stat().st_uid == 0
    (sticky / "theirs").mkdir()
    os.chown(sticky / "theirs", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="owned by nobody"):
        ensure_dir(str(sticky / "theirs"), 0o755)
    problem = parent_problem(str(sticky / "x.log"))
    assert problem is not None and "world-writable" in problem


def test_one_apply_walks_a_tree_it_found_safe_once_and_the_way_to_it_every_time(yard: Path) -> None:
    """An extra site-packages (the lab's torch: tens of thousands of files) is walked whole by the
    read role; within one apply (reconcile.safety.filesafety.walked_once, under the lock) the plan
    after the Changes does not walk a tree the plan before them found safe: only root or we can have
    changed it since. The way to it is checked again each time, a tree with a problem is walked again,
    and the next apply walks it afresh."""
    from reconcile.safety.filesafety import read_problem, walked_once

    site = yard / "site"
    module = site / "pkg" / "sub" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text("")
    with walked_once():
        assert read_problem(str(site), entries=-1) is None
        site.chmod(0o777)  # the way to the tree: checked every time
        assert f"{site} is writable by others" in str(read_problem(str(site), entries=-1))
        site.chmod(0o755)
        os.chown(module, NOBODY, NOBODY)  # root's doing, after the walk found the tree safe
        assert read_problem(str(site), entries=-1) is None  # not walked again in this apply
    found = read_problem(str(site), entries=-1)  # the next apply
    assert f"{module} is owned by" in str(found), found
    with walked_once():
        assert f"{module} is owned by" in str(read_problem(str(site), entries=-1))
        os.chown(module, 0, 0)
        assert read_problem(str(site), entries=-1) is None  # a tree with a problem is walked again
