"""Issue 24's hostile reader, seventeenth round, part A: the venv build (actions/venv.py,
actions/venv_index.py, probes/venv.py, and what they hand to pip and uv), which no round had re-read as a
whole since the ninth. Read as `nobody` (or the owner of a file on a path root's tools read, of a file in
a wheelhouse, of a file in an interpreter's install) with only docs/security.md and the code. Each attack
runs for real: a real apply, real pip 23.2.1 and uv 0.13.9, a real wheel whose `.pth` records who ran it;
each was seen succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader8 import _wheel, never_installed, nobodys_index
from tests.test_hostile_reader9 import _as_nobody, _standalone_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

UV_BIN = str(Path(sys.executable).parent)  # this checkout's venv: uv 0.13.9 beside the python running us


def _nobodys(path: Path, text: str) -> Path:
    """A file of nobody's at `path` (its directories made by root, 0755)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, NOBODY, NOGROUP)
    return path


# --- a version specifier that pip reads as a path ------------------------------------------------------


def test_a_version_specifier_never_hands_pip_a_path(demo: Demo, outside: Path) -> None:
    """`[venv] packages` values are version specifiers, checked by `packaging`'s SpecifierSet, and handed
    to pip as `name + specifier`. PEP 440's arbitrary equality `===` takes any string without blanks,
    `;` or `)`: `ninja = "===1/../var/tmp/<nobody's dir>/ninja-99.0-py3-none-any.whl"` passed. pip
    reads a requirement holding `/` as a path, made absolute from its working directory (`/`) and
    normalised lexically, so `ninja===1/..` is gone and nobody's wheel, which no path role had judged,
    is what it installs (a directory there would have been built: its setup.py run). main: root's venv
    got nobody's ninja 99.0 and its `.pth` ran as uid 0 (uv refuses the requirement)."""
    theirs = nobodys_dir(outside, "wheels")
    marker = outside / "ran-as"
    wheel = _wheel(theirs, marker)
    os.chown(wheel, NOBODY, NOGROUP)
    smuggled = f"===1/..{wheel}"

    def edit(doc: Any) -> None:
        doc["venv"]["installer"] = "pip"
        doc["venv"]["packages"]["ninja"] = smuggled

    spec = demo.write_spec(edit)
    run = demo.cli("apply", spec=spec, timeout=300)
    never_installed(demo, run.output, marker)
    assert "venv.packages.ninja" in run.output and "not a version specifier" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


@pytest.mark.parametrize("value", ["===1.0", "===1.0.post1+local", ">=1.10, !=1.11.*", "~=1.11"])
def test_a_version_specifier_of_version_characters_still_loads(tmp_path: Path, value: str) -> None:
    """The fix's other side: arbitrary equality and every operator with a version's own characters load."""
    from reconcile.spec.loader import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text(f'[venv]\npath = "{tmp_path}/venv"\npackages = {{ ninja = "{value}" }}\n')
    assert load_spec(str(spec)).spec.venv.packages["ninja"] == value  # type: ignore[union-attr]


# --- the config files pip and uv read for themselves ----------------------------------------------------


def _home(outside: Path) -> Path:
    """A home of root's (0755, in root's yard): it passes the environment's rule for HOME, which
    judges the directory itself, not what it holds."""
    home = outside / "home"
    home.mkdir()
    return home


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_config_file_of_nobodys_that_roots_installer_reads_by_default_never_chooses_its_index(
    demo: Demo, outside: Path, installer: str
) -> None:
    """pip and uv read config files no variable names: `$HOME/.config/pip/pip.conf` and
    `$HOME/.pip/pip.conf`, `/etc/pip.conf` and `<XDG_CONFIG_DIRS entry>/pip/pip.conf`,
    `$HOME/.config/uv/uv.toml`, `/etc/uv/uv.toml`, a `uv.toml` or `pyproject.toml` in the working
    directory or above. The environment's rule judges a directory a variable names with three levels of
    what it holds, but HOME only as a directory (round 12: a home is large), and the defaults not at all;
    docs/security.md says another user's config file is the path rule's. Under `sudo -E` HOME is root's
    directory, and the one file in it that chooses the index is nobody's (a dotfiles copy that kept its
    owner). main: root's apply took nobody's index from it: nobody's ninja 99.0 installed, its `.pth`
    ran as uid 0."""
    index, marker = nobodys_index(outside)
    home = _home(outside)
    if installer == "pip":
        _nobodys(home / ".config" / "pip" / "pip.conf", f"[global]\nindex-url = file://{index}/simple\n")
    else:
        _nobodys(home / ".config" / "uv" / "uv.toml", f'index-url = "file://{index}/simple"\n')

    def edit(doc: Any) -> None:
        doc["venv"]["installer"] = installer

    spec = demo.write_spec(edit)
    env = {"HOME": str(home), "PATH": f"{UV_BIN}:{os.environ['PATH']}"}
    run = demo.cli("apply", spec=spec, timeout=300, env=env)
    plan = demo.cli("plan", spec=spec, env=env)
    never_installed(demo, run.output, marker)
    for result in (run, plan):
        assert f"{home}/.config/{installer}/" in result.output and "owned by nobody" in result.output, (
            result.output
        )
        assert result.returncode == 1 and "Traceback" not in result.output, result.output


def test_a_cache_of_nobodys_in_roots_home_never_hands_root_their_files(demo: Demo, outside: Path) -> None:
    """uv installs a wheel it has unpacked before from its cache (`archive-v0/<id>/`, found again by the
    wheel's location), and links what that directory holds into the venv: it never reads the wheel again.
    With no UV_CACHE_DIR nor XDG_CACHE_HOME its cache is `$HOME/.cache/uv`; under `sudo -E` HOME is a
    directory of root's (it passes the environment's rule, which judges the directory only) whose `.cache`
    is nobody's, who adds a `.pth` to the unpacked ninja there. Seen on this branch before its fix (main's
    code for it): root's venv got nobody's `.pth` with ninja from root's own wheelhouse, run as uid 0."""
    home = _home(outside)
    cache = nobodys_dir(home, ".cache")
    wheelhouse = outside / "wheelhouse"
    wheelhouse.mkdir()
    shutil.copy(next(Path("/opt/pypi/files").glob("ninja-*.whl")), wheelhouse)
    scratch = outside / "scratch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(scratch)], check=True)
    uv = [f"{UV_BIN}/uv", "pip", "install", "--python", f"{scratch}/bin/python", "--no-index"]
    env = {"HOME": str(home), "PATH": f"{UV_BIN}:{os.environ['PATH']}"}
    subprocess.run([*uv, "--find-links", str(wheelhouse), "ninja"], check=True, env={**os.environ, **env})
    subprocess.run(["chown", "-R", "nobody:nogroup", str(cache)], check=True)  # nobody's cache, as theirs
    marker = outside / "ran-as"
    unpacked = next(cache.glob("uv/archive-v0/*/ninja")).parent
    line = f"import os; open({str(marker)!r}, 'a').write('uid=%d' % os.getuid())"
    _as_nobody("sh", "-c", f'printf "%s\\n" "$1" > {unpacked}/zz_theirs.pth', "sh", line)

    def edit(doc: Any) -> None:
        doc["venv"]["installer"] = "uv"
        doc["venv"]["wheelhouse"] = str(wheelhouse)

    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300, env=env)
    ran = marker.read_text() if marker.exists() else ""
    assert not ran, f"nobody's .pth ran ({ran!r}): {run.output}"
    assert f"{cache} is owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


# --- the wheelhouse, as pip reads it ---------------------------------------------------------------------


def test_a_wheel_of_nobodys_below_the_wheelhouses_top_level_that_a_page_there_links_is_refused(
    demo: Demo, outside: Path
) -> None:
    """The wheelhouse was judged one level down, "as pip reads it" (`--find-links <dir>` lists its top
    level). But pip also reads each HTML file of that top level as a page and takes the archives it links,
    relative links below the directory included (uv does not). A wheelhouse of root's (a tarball's,
    owners kept) whose `index.html` links `sub/ninja-99.0-py3-none-any.whl`, that one file nobody's.
    main: planned clean; root's venv got nobody's ninja 99.0 and its `.pth` ran as uid 0."""
    wheelhouse = outside / "wheelhouse"
    (wheelhouse / "sub").mkdir(parents=True)
    marker = outside / "ran-as"
    wheel = _wheel(wheelhouse / "sub", marker)
    os.chown(wheel, NOBODY, NOGROUP)
    (wheelhouse / "index.html").write_text(f'<a href="sub/{wheel.name}">{wheel.name}</a>\n')

    def edit(doc: Any) -> None:
        doc["venv"]["installer"] = "pip"
        doc["venv"]["wheelhouse"] = str(wheelhouse)

    spec = demo.write_spec(edit)
    run = demo.cli("apply", spec=spec, timeout=300)
    never_installed(demo, run.output, marker)
    assert "[venv].wheelhouse" in run.output and f"{wheel} is owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


# --- the spec's interpreter: what it reads besides its program -------------------------------------------


def test_a_module_of_nobodys_in_the_specs_interpreters_standard_library_never_runs_when_root_makes_the_venv(
    demo: Demo, outside: Path
) -> None:
    """Root runs `[venv] python` with `-I -S` (round 9): no site, so no `.pth` and no sitecustomize. But
    `python -I -S -m venv` still imports its standard library: `venv` itself, `encodings` at every start,
    and ensurepip with its bundled pip wheel for a venv pip installs into. The exec role judged the
    program only (round 9 left the standard library open). A standalone install unpacked with its
    archive's owners kept: root's binary and directories, its `venv/__init__.py` nobody's. main: apply's
    venv creation ran nobody's line as uid 0."""
    base = outside / "base"
    base.mkdir()
    python = _standalone_python(base, outside / "pth-ran-as")
    marker = outside / "ran-as"
    init = _nobodys_venv_module(python, marker)

    def edit(doc: Any) -> None:
        doc["venv"]["python"] = str(python)

    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300)
    ran = marker.read_text() if marker.exists() else ""
    assert not ran, f"nobody's venv module ran ({ran!r}): {run.output}"
    assert f"{init} is owned by nobody" in run.output, run.output
    # Refused where root runs the interpreter (actions.venv.trusted_python), not in the plan: walking a
    # standard library costs ~60 ms, paid at a venv's creation, its release check and `reconcile lock`.
    assert run.returncode == 4 and "Traceback" not in run.output, run.output
    assert not (demo.venv / "pyvenv.cfg").exists(), "the venv was made with nobody's module"


def _nobodys_venv_module(python: Path, marker: Path) -> Path:
    """In the standalone install of `python` (_standalone_python's), `venv/__init__.py` a copy of
    nobody's that records who ran it in `marker`. Returns that file."""
    lib = next((python.parent.parent / "lib").glob("python3*"))
    venv_pkg = lib / "venv"
    real = venv_pkg.resolve()
    venv_pkg.unlink()
    shutil.copytree(real, venv_pkg, ignore=shutil.ignore_patterns("__pycache__"))
    init = venv_pkg / "__init__.py"
    init.write_text(init.read_text() + f"\nopen({str(marker)!r}, 'a').write('uid=%d\\n' % os.getuid())\n")
    os.chown(init, NOBODY, pwd.getpwnam("nobody").pw_gid)
    return init


def test_an_interpreter_whose_install_is_roots_alone_passes() -> None:
    """The fix's other side: the interpreter running these tests (root's install, its site-packages
    full of packages) has nothing another user can change in what it reads at start."""
    from actions.venv import library_problem

    assert library_problem(os.path.realpath(sys._base_executable)) is None  # type: ignore[attr-defined]
