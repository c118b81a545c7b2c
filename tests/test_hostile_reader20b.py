"""Issue 24's hostile reader, twentieth round, part B: what round 19 changed (reconcile/safety/elf.py's
reading at addresses, filesafety's library walk and its count, `_library_copies`, the audit and filter
libraries, `pyvenv_home`). Read as `nobody` (or the owner of one file in an install unpacked with its
archive's owners, round 3's premise) with only docs/security.md and the code. Each attack runs for
real; each was seen succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.test_hostile_reader9 import _standalone_python
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
