"""Issue 24's hostile reader, twelfth round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what rounds 9-11 added, first the exec role's reading of
`#!` lines and the PATH it looks on, then the value role's reading of relative words, found by reading
docs/security.md and the code alone, each run for real (`nobody`'s files in root directories, real
scripts, GNU coreutils, the real CLI and the fake vLLM server), each seen succeeding on main before its
fix.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import FAKE_VLLM, Demo
from tests.test_hostile_reader9 import refused_as_server
from tests.test_hostile_reader10 import _theirs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

_SERVE = f"exec(open({str(FAKE_VLLM)!r}).read())\n"


def _server(path: Path, line: str) -> Path:
    """Root's python script `path` whose `#!` line is `line`; its body runs the fake vLLM server."""
    path.write_text(f"#!{line}\n{_SERVE}")
    path.chmod(0o755)
    return path


# --- class 1: the exec role's `#!` reading (what an interpreter runs) ---------------------------------

# Each a `#!` line whose interpreter (root's, judged) runs a program it looks up on PATH by the name the
# line gives it: coreutils' nice and nohup run their first argument as a command, as env does; env
# reached through a link of root's by another name (the rule knew env by the name on the line); env -S
# running nice, whose argument is the program. Rounds 9 and 10 judged the program of `#!.../env NAME`
# only.
RUNNERS = {
    "nice": "/usr/bin/nice theirpython",
    "nohup": "/usr/bin/nohup theirpython",
    "env by another name": "{outside}/run -S theirpython",
    "env -S running nice": "/usr/bin/env -S nice theirpython",
}


@pytest.mark.parametrize("form", list(RUNNERS))
def test_a_program_an_interpreter_runs_by_name_is_judged_or_refused(
    demo: Demo, outside: Path, form: str
) -> None:
    """`[server] executable` a script of root's whose `#!` interpreter is root's program that runs
    another by name (nice, nohup; env under another name; env -S running nice), that name being a
    program of nobody's in a root directory on PATH (a tarball's owners kept, round 3's premise). main:
    planned clean; root's server ran nobody's program (it records uid 0, then runs the fake server)."""
    tools = outside / "bin"
    tools.mkdir()
    marker = outside / "ran-as"
    theirs = _theirs(tools, marker)
    os.symlink("/usr/bin/env", outside / "run")
    server = _server(outside / "serve", RUNNERS[form].format(outside=outside))
    refused_as_server(demo, server, marker, str(server), env={"PATH": f"{tools}:{os.environ['PATH']}"})
    assert theirs.exists()


def test_a_relative_interpreter_on_a_shebang_line_is_refused(demo: Demo, outside: Path) -> None:
    """The kernel resolves a relative `#!` interpreter from the process's working directory, "/" for
    the server; the exec role's walk resolved it from reconcile's own (the timer's unit runs in the
    spec's directory; here the demo's root), so a root's file at that relative path there passed while
    the server ran nobody's at the same path under "/". main: planned clean; root's server ran nobody's
    program."""
    tools = outside / "bin"
    tools.mkdir()
    marker = outside / "ran-as"
    _theirs(tools, marker)
    relative = str(tools.relative_to("/") / "theirpython")
    decoy = demo.root / relative  # root's, where reconcile's working directory puts the name
    decoy.parent.mkdir(parents=True)
    decoy.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    decoy.chmod(0o755)
    server = _server(outside / "serve", relative)
    refused_as_server(demo, server, marker, str(server), relative)


def test_a_relative_entry_in_the_servers_path_is_refused(demo: Demo, outside: Path) -> None:
    """Round 10 left it open: `[server] env PATH = "<venv>/bin:var/tmp/x/bin:$PATH"`. The server runs
    in "/", so env finds `theirpython` in /var/tmp/x/bin; the exec role's lookup (shutil.which on that
    PATH) resolved the relative entry from reconcile's own working directory, found nothing there and
    judged nothing. The value role judged the directory /var/tmp/x/bin (root's: it passes), not the
    program in it. main: planned clean; root's server ran nobody's program."""
    tools = outside / "bin"
    tools.mkdir()
    marker = outside / "ran-as"
    _theirs(tools, marker)
    server = _server(outside / "serve", "/usr/bin/env theirpython")
    relative = str(tools.relative_to("/"))

    def spec_path(doc: Any) -> None:
        doc["server"].setdefault("env", {})["PATH"] = f"{demo.venv}/bin:{relative}:$PATH"

    refused_as_server(demo, server, marker, "server.env.PATH", relative, edit_more=spec_path)
