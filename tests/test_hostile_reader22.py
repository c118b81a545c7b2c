"""Issue 24's hostile reader, twenty-second round: what round 21 changed (the files getpath reads beside
the program: `._pth`, `pybuilddir.txt`, and what a `._pth` names). Read as `nobody` (or the owner of one
file in an install of root's, round 3's premise) with only docs/security.md, the code and this machine's
python 3.11. Each attack runs for real; each was seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.ownership_support import nobodys_dir
from tests.test_hostile_reader9 import _standalone_python, applied_with_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")


@pytest.mark.parametrize("marker_file", ["Modules/Setup.local", "pybuilddir.txt"])
def test_a_build_trees_lib_of_nobodys_never_runs_their_module_when_root_makes_the_venv(
    demo: Demo, outside: Path, marker_file: str
) -> None:
    """getpath (3.11, 3.12) takes the program for one run from its build tree when `Modules/Setup.local`
    or `pybuilddir.txt` is beside it: the standard library is then the first `Lib` (with `os.py`) from
    the program's directory up, whatever `lib/python3.X` holds (seen by hand: a copy of
    /usr/bin/python3.11 with `Modules/Setup.local` beside it imported `../Lib/venv` at `-I -S -m venv`).
    library_problem judged `lib*/python3*` only. Round 9's standalone install (root's), a build marker
    of root's beside its program and `Lib` of root's beside `bin` (the real library linked entry by
    entry), its `venv` package nobody's (the archive's owners kept). main: apply's `python -I -S -m venv`
    imported nobody's `venv` as uid 0 (each case)."""
    marker = outside / "ran-as"
    python = _standalone_python(outside, outside / "pth-ran-as")
    (python.parent / marker_file).parent.mkdir(exist_ok=True)
    (python.parent / marker_file).write_text("")
    built = python.parents[1] / "Lib"
    built.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for entry in os.listdir(stdlib):
        if entry not in ("venv", "site-packages"):
            (built / entry).symlink_to(stdlib / entry)
    theirs = nobodys_dir(built, "venv")
    line = f"import os; open({str(marker)!r}, 'a').write('uid=%d\\n' % os.getuid())\n"
    for name in ("__init__.py", "__main__.py"):
        (theirs / name).write_text(line)
    output = applied_with_python(demo, python, marker)
    assert f"{theirs} is owned by nobody" in output, output
