"""Issue 24's hostile reader, twenty-first round: what round 20 changed (the front's socket directory,
the `--uds` refusal, the loader's inherited DT_RPATH, LD_LIBRARY_PATH and DSTs in needed names, the
standard library's extension modules, `pyvenv_home`, the prefix and exec_prefix trees). Read as
`nobody` (or the owner of one file in an install unpacked with its archive's owners, round 3's premise)
with only docs/security.md and the code. Each attack runs for real; each was seen succeeding on main
before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader9 import _standalone_python, applied_with_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")


@pytest.mark.parametrize("beside", ["program", "home", "named"])
def test_a_pth_file_of_nobodys_beside_the_specs_interpreter_never_runs_their_module_when_root_makes_the_venv(
    demo: Demo, outside: Path, beside: str
) -> None:
    """getpath (3.11+, Linux too) reads `<program>._pth` beside the program, beside the base program a
    pyvenv.cfg's `home` names, and beside its shared libpython: its lines replace sys.path whole, -I -S
    or not (seen: a copied /usr/bin/python3.11 with `python3.11._pth` naming `../evil` first imported
    `../evil/venv` at `-I -S -m venv`; a copy in a venv whose `home` was that `bin` did the same).
    library_problem judged pyvenv.cfg and the prefixes' trees, not this file. Round 9's standalone
    install (root's program and library), its `bin/python3._pth` nobody's (the archive's owners kept),
    naming nobody's directory before the real library; `[venv] python` that install's program, or a venv's
    made from it with `--copies` (root's). Or (`named`) the `._pth` root's, and the directory its line
    names nobody's: the file was then judged, not what it puts on the path (as round 6 reads a `.pth`'s
    lines). main, and the branch with the file's rule only: apply's `python -I -S -m venv` imported
    nobody's `venv` as uid 0 (each case)."""
    marker = outside / "ran-as"
    python = _standalone_python(outside, outside / "pth-ran-as")
    named = python
    if beside == "home":
        named = outside / "copied" / "bin" / "python3"
        made = [python, "-I", "-S", "-m", "venv", "--copies", "--without-pip", named.parents[1]]
        subprocess.run(made, check=True)
    theirs = nobodys_dir(outside, "theirs")
    (theirs / "venv").mkdir()
    line = f"import os; open({str(marker)!r}, 'a').write('uid=%d\\n' % os.getuid())\n"
    for name in ("__init__.py", "__main__.py"):
        (theirs / "venv" / name).write_text(line)
    stdlib = python.parents[1] / "lib" / Path(sysconfig.get_paths()["stdlib"]).name
    pth = python.parent / "python3._pth"
    pth.write_text(f"{theirs}\n{stdlib}\n{stdlib / 'lib-dynload'}\n")
    if beside != "named":
        os.chown(pth, NOBODY, NOGROUP)
    output = applied_with_python(demo, named, marker)
    assert f"{theirs if beside == 'named' else pth} is owned by nobody" in output, output
