"""Issue 24's hostile reader, twentieth round, part B: what round 19 changed (reconcile/safety/elf.py's
reading at addresses, filesafety's library walk and its count, `_library_copies`, the audit and filter
libraries, `pyvenv_home`). Read as `nobody` (or the owner of one file in an install unpacked with its
archive's owners, round 3's premise) with only docs/security.md and the code. Each attack runs for
real; each was seen succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.ownership_support import nobodys_dir
from tests.test_hostile_reader9 import _standalone_python, applied_with_python
from tests.test_hostile_reader18 import _theirs, copied_venv
from tests.test_hostile_reader19 import _library, _loads_then_refused, _nobodys_library, _program, _runpath

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (builds a program and a library)"),
]


def _rpath(libs: Path, *names: str) -> list[str]:
    """Link flags: need each of `names` (libNAME.so), found through the DT_RPATH (not RUNPATH) `libs`."""
    return [*_runpath(libs, *names)[:-1], f"-Wl,-rpath,{libs},--disable-new-dtags"]


@pytest.mark.parametrize("holder", ["program", "library"])
def test_a_library_of_nobodys_found_through_an_inherited_rpath_never_loads(
    demo: Demo, outside: Path, holder: str
) -> None:
    """The reader looked for each object's libraries in its own RPATH/RUNPATH only; the loader looks for
    the libraries of an object with no DT_RUNPATH in the DT_RPATH of every object above it too, up to the
    program (ld.so(8): the DT_RPATH of the binary, "if present and DT_RUNPATH does not exist"; glibc's
    _dl_map_object walks l_loader). A program of root's whose DT_RPATH (or whose first library's DT_RPATH)
    is a directory of root's holding `libra.so` (which needs `librb.so`, and has no path of its own) and
    `librb.so`, whose RUNPATH is nobody's directory, where the library it needs is. main: the reader never
    found `librb.so` (`libra.so` names no directory), the exec role passed the program, and apply's
    `python -I -S -m venv` loaded nobody's library as uid 0 (each case)."""
    theirs, marker = _nobodys_library(outside)
    libs = outside / "libs"
    libs.mkdir()
    _library(libs / "librb.so", *_runpath(theirs, "z9"))
    if holder == "program":
        _library(libs / "libra.so", "-Wl,--no-as-needed", f"-L{libs}", "-lrb")
        program = _program(outside, *_rpath(libs, "ra"))
    else:
        top = outside / "top"
        top.mkdir()
        _library(libs / "libra.so", "-Wl,--no-as-needed", f"-L{libs}", "-lrb")
        _library(top / "libtop.so", *_rpath(libs, "ra"))  # its DT_RPATH serves libra.so's needs too
        program = _program(outside, *_runpath(top, "top"))
    output = _loads_then_refused(demo, program, marker)
    assert "owned by nobody" in output, output


def test_a_library_of_nobodys_an_extension_module_of_the_standard_library_loads_never_loads(
    demo: Demo, outside: Path
) -> None:
    """The exec role reads what the loader loads for the program; round 17 holds the standard library's
    files to the read role, each as a file. But python's extension modules (`lib-dynload/*.so`) are
    shared objects it dlopens as it imports them, and the loader loads what each needs, through its own
    RUNPATH: `-m venv` imports `subprocess`, whose `_posixsubprocess` is one. A standalone install
    (round 9's) whose `lib-dynload/_posixsubprocess.cpython-3X-....so` is root's, its RUNPATH a directory
    of nobody's, where the library it needs is (a vendor's build whose RUNPATH names a directory of the
    machine it was built on). main: apply's `python -I -S -m venv` loaded nobody's library as uid 0."""
    theirs, marker = _nobodys_library(outside)
    python = _standalone_python(outside, outside / "pth-ran-as")
    dynload = python.parent.parent / "lib" / Path(sysconfig.get_paths()["stdlib"]).name / "lib-dynload"
    real = dynload.readlink()
    dynload.unlink()
    dynload.mkdir()
    for entry in os.listdir(real):
        (dynload / entry).symlink_to(real / entry)
    module = dynload / f"_posixsubprocess{sysconfig.get_config_var('EXT_SUFFIX')}"
    module.unlink()
    _library(module, *_runpath(theirs, "z9"))
    output = _loads_then_refused(demo, python, marker, "-I", "-S", "-c", "import _posixsubprocess")
    assert "owned by nobody" in output, output


@pytest.mark.parametrize("form", ["not-utf8", "nul"])
def test_a_module_of_nobodys_where_getpath_reads_a_copied_venvs_cfg_never_runs_when_root_makes_the_venv(
    demo: Demo, outside: Path, form: str
) -> None:
    """getpath reads pyvenv.cfg as a C string decoded as UTF-8 with surrogateescape: a byte that is not
    UTF-8 is that byte in every path python opens (seen: `sys._base_executable` `/opt\\udcffx/bin/python3`),
    and the file ends at its first NUL (seen: `\\0\\nhome = /usr/bin` read as no `home`). pyvenv_home
    read U+FFFD for the byte (a path that is not there, and library_problem walked up from it to
    another library, `/usr/lib/python3.11`, root's) and read past the NUL. A venv's python made with
    `--copies` (root's) from round 17's standalone install (root's, its `venv/__init__.py` nobody's):
    its pyvenv.cfg's `home` that install's `bin` after it moved to a directory named `base\\xff`; or the
    venv moved into that install, its pyvenv.cfg (root's) starting with a NUL and naming this machine's
    python as `home` after it (getpath walks up from the venv and finds the install's library). main:
    apply's `python -I -S -m venv` ran nobody's line as uid 0 (each case)."""
    python, copied, marker, _ = copied_venv(outside)
    install = python.parents[1]
    if form == "not-utf8":
        odd = os.fsencode(python.parents[2]) + b"\xff"
        os.rename(os.fsencode(python.parents[2]), odd)
        home, head = odd + b"/" + os.fsencode(python.parent.relative_to(python.parents[2])), b""
    else:
        copied = copied.rename(install / "copied")
        home, head = os.fsencode(os.path.dirname(os.path.realpath(sys._base_executable))), b"\0\n"  # type: ignore[attr-defined]
    cfg = copied / "pyvenv.cfg"
    lines = cfg.read_bytes().splitlines(True)
    cfg.write_bytes(head + b"".join(b"home = " + home + b"\n" if x.startswith(b"home") else x for x in lines))
    output = applied_with_python(demo, copied / "bin" / "python3", marker)
    assert "venv/__init__.py is owned by nobody" in output, output


def test_a_library_of_nobodys_behind_a_library_root_finds_through_ld_library_path_never_loads(
    demo: Demo, outside: Path
) -> None:
    """The loader searches LD_LIBRARY_PATH (after a program's DT_RPATH, before its RUNPATH) for what a
    program and each of its libraries need; the environment rule holds the directory it names to the
    write-dir role and its files to the read role, but the reader never looked there for libraries, so
    what a library found there loads in turn was not read. Root's environment with
    `LD_LIBRARY_PATH=<libs>` (a vendor's directory, as CUDA's install guide sets for its own), root's,
    holding `librl.so`, root's, whose RUNPATH is nobody's directory, where the library it needs is; the
    spec's python (root's) needs `librl.so` and names no directory. main: apply's `python -I -S -m venv`
    loaded nobody's library as uid 0."""
    theirs, marker = _nobodys_library(outside)
    libs = outside / "libs"
    libs.mkdir()
    _library(libs / "librl.so", *_runpath(theirs, "z9"))
    program = _program(outside, "-Wl,--no-as-needed", f"-L{libs}", "-lrl")
    env = {"LD_LIBRARY_PATH": str(libs)}
    subprocess.run([program], check=False, env={**os.environ, **env})
    assert marker.read_text() == "uid=0\n"  # the loader loads it
    marker.unlink()
    output = applied_with_python(demo, program, marker, env)
    assert "owned by nobody" in output, output


def test_a_library_of_nobodys_a_program_names_by_origin_never_loads(demo: Demo, outside: Path) -> None:
    """The loader expands $ORIGIN, $LIB and $PLATFORM in a needed name with a `/` as in a RUNPATH; the
    reader judged the name as a path from "/" (`/$ORIGIN/theirs/libz9.so`: not there, nothing judged). A
    program of root's whose DT_NEEDED (the SONAME of the library it was linked with) is
    `$ORIGIN/theirs/libz9.so`, `theirs` beside it a directory of nobody's. main: the exec role passed
    it, and apply's `python -I -S -m venv` loaded nobody's library as uid 0."""
    stub = outside / "stub" / "libz9.so"
    stub.parent.mkdir()
    _library(stub, "-Wl,-soname,$ORIGIN/theirs/libz9.so")
    program = _program(outside, "-Wl,--no-as-needed", str(stub))
    marker = outside / "ran-as"
    _theirs(nobodys_dir(program.parent, "theirs") / "libz9.so", marker)
    output = _loads_then_refused(demo, program, marker)
    assert f"{program.parent / 'theirs'} is owned by nobody" in output, output


def test_an_extension_module_of_nobodys_where_getpath_finds_the_exec_prefix_never_loads(
    demo: Demo, outside: Path
) -> None:
    """getpath finds two prefixes, each walking up from the program's directory on its own: `prefix`, the
    first with `lib/python3.X/os.py`, and `exec_prefix`, the first with `lib/python3.X/lib-dynload` (a
    directory), where the extension modules are imported from (seen: `sys.exec_prefix` `<base>/inner`,
    `sys.prefix` `<base>`). library_problem judged the first only. Round 9's standalone install at
    `<base>` (root's), and in it `inner/bin/python3` (a copy of its program) beside
    `inner/lib/python3.X/lib-dynload`, whose `_posixsubprocess` is nobody's. main: apply's `python -I
    -S -m venv` loaded nobody's module as uid 0."""
    base = _standalone_python(outside, outside / "pth-ran-as").parent.parent
    inner = base / "inner"
    (inner / "bin").mkdir(parents=True)
    shutil.copy2(base / "bin" / "python3", inner / "bin" / "python3")
    name = Path(sysconfig.get_paths()["stdlib"]).name
    real = (base / "lib" / name / "lib-dynload").resolve()
    dynload = inner / "lib" / name / "lib-dynload"
    dynload.mkdir(parents=True)
    for entry in os.listdir(real):
        (dynload / entry).symlink_to(real / entry)
    module = dynload / f"_posixsubprocess{sysconfig.get_config_var('EXT_SUFFIX')}"
    module.unlink()
    marker = outside / "ran-as"
    _theirs(module, marker)
    output = _loads_then_refused(
        demo, inner / "bin" / "python3", marker, "-I", "-S", "-c", "import _posixsubprocess"
    )
    assert f"{module} is owned by nobody" in output, output
