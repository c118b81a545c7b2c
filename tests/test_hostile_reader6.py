"""Issue 24's hostile reader, sixth round, classes 1-3 (the path-trust layer, untrusted trees and files,
the spec's own provenance): attacks on what the fifth round's fixes added (the environment's per-user
directories, the data role, the walked-once cache of safe trees, the compile caches), found by reading
docs/security.md and the code alone, each run for real (a `nobody` file or process through setpriv,
real files, links, uv), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in, seed_venv
from tests.ownership_support import nobodys_dir
from tests.test_untrusted_trees import Tree, tree

__all__ = ["tree"]  # the fixture: a model source tree of nobody's

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files and processes of another user)")

NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = pwd.getpwnam("nobody").pw_gid


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo with a venv made by a real apply, copied."""
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", *args],
        capture_output=True, text=True, timeout=timeout, cwd="/", env={**os.environ, **(env or {})},
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


def _lock_spec(root: Path, wheelhouse: Path) -> Path:
    """A spec with only [machine] and [venv] (ninja, from an empty wheelhouse), as `reconcile lock`
    reads it."""
    spec = root / "spec" / "demo.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text(
        f'[machine]\nstate_dir = "{root}/state"\n\n[venv]\npath = "{root}/venv"\n'
        f'python = "/usr/bin/python3"\nwheelhouse = "{wheelhouse}"\npackages = {{ ninja = "*" }}\n'
    )
    return spec


def _nobodys_uv_config(tmp_path: Path, outside: Path) -> tuple[Path, Path, Path]:
    """(nobody's config dir, a root-only dir, a lock spec): <theirs>/uv/uv.toml names as uv's cache
    <theirs>/cache, nobody's link to the root-only directory."""
    theirs = nobodys_dir(outside, "xdg")
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    (theirs / "uv").mkdir()
    (theirs / "uv" / "uv.toml").write_text(f'cache-dir = "{theirs}/cache"\n')
    os.symlink(target, theirs / "cache")
    for path in (theirs / "uv", theirs / "uv" / "uv.toml", theirs / "cache"):
        os.lchown(path, NOBODY, NOGROUP)  # nobody's files in nobody's directory
    (outside / "no-wheels").mkdir()
    return theirs, target, _lock_spec(tmp_path, outside / "no-wheels")


# --- class 1: the path-trust layer (the environment root's tools read) ------------------------------


def test_a_uv_config_in_another_users_xdg_config_dirs_never_steers_roots_uv(
    tmp_path: Path, outside: Path
) -> None:
    """The fifth round checks the per-user directories it listed (HOME, XDG_CONFIG_HOME, XDG_CACHE_HOME,
    UV_CACHE_DIR, ...), but uv also reads a system-level config from each of $XDG_CONFIG_DIRS
    (<dir>/uv/uv.toml), and so do other tools: `sudo -E reconcile lock` hands root's uv nobody's
    uv.toml, which chooses its cache (there: a link into a root-only directory), its indexes, its
    overrides. main: uv wrote its cache, as root, into the root-only directory nobody's config named."""
    theirs, target, spec = _nobodys_uv_config(tmp_path, outside)
    code, output = _cli("lock", "--spec", str(spec), env={"XDG_CONFIG_DIRS": f"/etc/xdg:{theirs}"})
    assert sorted(p.name for p in target.iterdir()) == [], output
    assert code == 1, output  # the wheelhouse is empty: no closure, said in one line
    assert f"reconcile: environment XDG_CONFIG_DIRS left out: /etc/xdg:{theirs}" in output, output
    assert "Traceback" not in output, output


def test_a_cache_dir_the_specs_server_env_names_in_nobodys_directory_is_refused(
    demo: Demo, outside: Path
) -> None:
    """Every path the spec names has a role (reconcile.spec.roles), but `[server] env` values were not
    paths to it: `VLLM_CACHE_ROOT` (or HF_HOME, TRITON_CACHE_DIR, ...) naming a directory nobody owns
    hands root's server a compile cache nobody fills: a link there sends root's writes where nobody
    chooses, and a planted artifact (torch.compile's, Triton's, FlashInfer's are code) is loaded by
    root's server. The same rule as the environment's (the write-dir role for a directory, the read
    role for a file) holds each absolute path in `[server] env`. main: root's server wrote its compile
    cache through nobody's link into a root-only directory."""
    theirs = nobodys_dir(outside, "vllm-cache")
    target = outside / "root-only"
    target.mkdir(mode=0o700)
    os.symlink(target, theirs / "torch_compile_cache")
    os.lchown(theirs / "torch_compile_cache", NOBODY, NOGROUP)

    def edit(doc: Any) -> None:
        doc["server"]["env"]["VLLM_CACHE_ROOT"] = str(theirs)

    spec = demo.write_spec(edit)
    run = demo.cli("apply", spec=spec)
    assert sorted(p.name for p in target.iterdir()) == [], f"root's server wrote there: {run.output}"
    assert "[server].env.VLLM_CACHE_ROOT" in run.output and "owned by nobody" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_pth_line_of_the_venv_naming_nobodys_directory_never_runs_their_code_as_root(
    seeded: Demo, outside: Path
) -> None:
    """Every Python start processes the site dir's .pth files: each path line puts that directory on
    sys.path, and the start then imports `sitecustomize` from sys.path (Debian's venvs have none). The
    spec's `extra_site_packages` is held to the read role, whole tree, but a .pth already in the venv
    (`pip install -e` by an admin, a package's own .pth) naming another user's directory was not looked
    at: nobody's sitecustomize.py ran in root's server, and in every python root starts from the venv.
    main: it ran as uid 0."""
    theirs = nobodys_dir(outside, "proj")
    proof = theirs / "ran-as"
    code = f"import os\nopen({str(proof)!r}, 'w').write(str(os.getuid()))\n"
    (theirs / "sitecustomize.py").write_text(code)
    os.chown(theirs / "sitecustomize.py", NOBODY, NOGROUP)
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    (site / "__editable__.proj.pth").write_text(f"{theirs}\n")  # root's file, as pip -e writes it
    run = seeded.cli("apply")
    assert not proof.exists(), f"nobody's sitecustomize ran as uid {proof.read_text()}: {run.output}"
    assert "Traceback" not in run.output, run.output
    assert f"{theirs}" in run.output and "owned by nobody" in run.output, run.output


def test_a_module_of_nobodys_in_the_venvs_site_packages_fails_the_plan(seeded: Demo) -> None:
    """A venv copied in with its owners kept (`cp -a`, rsync, a tarball of a build user's), as a
    toolkit is (round 3): one module of nobody's in root's site-packages is theirs to rewrite, and
    root's server imports it. `[venv] path` was held to the write-dir role only (the directory and
    the way to it), never what is in it. main: the plan said nothing, apply started the server."""
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    module = site / "theirs_mod.py"
    module.write_text("")
    os.chown(module, NOBODY, NOGROUP)
    run = seeded.cli("plan")
    assert str(module) in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


# --- class 2: untrusted trees and files ------------------------------------------------------------


def test_the_plan_never_reads_a_root_only_config_through_nobodys_source_link(
    tree: Tree, outside: Path
) -> None:
    """The fifth round gave `[model] source` the data role: apply copies the tree only by the real path
    data_root() reached (a link from nobody's directory is not followed), and the preflight says so.
    But the plan's other readers of the source's config.json (the config patch's "was" values, the
    preflight's model facts) resolved `model.source` by name again, links and all, and took the tree
    it led to as the source: nobody's source made a link to a directory only root may enter put that
    directory's config.json values in root's plan. main: the root-only value was in the plan."""
    private = outside / "root-only"
    private.mkdir(mode=0o700)
    shutil.copytree(tree.source, private / "model")
    secret = "root-only-value-7d1c"
    config = json.loads((private / "model" / "config.json").read_text())
    config["rope_parameters"] = secret
    (private / "model" / "config.json").write_text(json.dumps(config))
    theirs = nobodys_dir(outside, "home")
    tree.as_nobody("ln", "-s", str(private / "model"), str(theirs / "model"))
    tree.spec.write_text(
        tree.spec.read_text().replace(f'source = "{tree.source}"', f'source = "{theirs}/model"')
    )
    run = tree.cli("plan")
    assert secret not in run.output, f"a root-only value reached the plan: {run.output}"
    assert "Traceback" not in run.output, run.output
    assert f"{theirs}/model" in run.output and "owned by nobody" in run.output, run.output


def test_a_source_named_through_roots_own_link_is_still_read_and_hashed(tree: Tree) -> None:
    """The other side of the fix above: a source named through a link root made in its own directory
    is followed (the data role), and every reader, the drift's hashing of a touched file included,
    reads the tree it reached: the plan says "touched", never "refused" or "outside the source"."""
    via = tree.root / "via"
    os.symlink(tree.source, via)  # root's link in root's directory
    tree.spec.write_text(tree.spec.read_text().replace(f'source = "{tree.source}"', f'source = "{via}"'))
    first = tree.cli("apply")
    assert "Traceback" not in first.output and "refused" not in first.output, first.output
    later = (tree.source / "config.json").stat().st_mtime + 5
    os.utime(tree.source / "config.json", (later, later))  # a new stamp, the same bytes: hashed again
    run = tree.cli("plan")
    assert "config.json (touched)" in run.output, run.output
    assert "refused" not in run.output and "outside the source" not in run.output, run.output
