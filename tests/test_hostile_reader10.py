"""Issue 24's hostile reader, tenth round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what the ninth round added, first its `#!/usr/bin/env`
rule (the exec role judges the program env runs), found by reading docs/security.md and the code
alone, each run for real (`nobody` through file ownership, real scripts, GNU env, the real CLI and the
fake vLLM server), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import FAKE_VLLM, Demo
from tests.test_hostile_reader9 import refused_as_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

NOBODY = pwd.getpwnam("nobody")

# A step of a chain: a python script that runs the next one (its argv[1]) with the same interpreter,
# as `#!/usr/bin/env NAME` hands NAME the script's path first.
_STEP = "import os, sys\nos.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"


def _theirs(tools: Path, marker: Path) -> Path:
    """nobody's program in a root directory (a tarball's owners kept): it records who ran it, then
    runs python on what it was given."""
    theirs = tools / "theirpython"
    theirs.write_text(f'#!/bin/sh\necho uid=$(id -u) >> {marker}\nexec {sys.executable} "$@"\n')
    theirs.chmod(0o755)
    os.chown(theirs, NOBODY.pw_uid, NOBODY.pw_gid)
    return theirs


def _script(path: Path, shebang: str, body: str) -> Path:
    path.write_text(f"#!/usr/bin/env {shebang}\n{body}")
    path.chmod(0o755)
    return path


def shebang_refused(
    demo: Demo,
    outside: Path,
    line: str,
    *named: str,
    env: dict[str, str] | None = None,
    edit_more: Callable[[Any], None] | None = None,
) -> None:
    """Root's `[server] executable` a python script of root's whose `#!` line is `line` (`{theirs}`,
    `{tools}`, `{outside}` filled in), nobody's `theirpython` in the root directory `outside/bin`
    (_theirs): refused_as_server, naming each of `named` (`{server}`, `{theirs}` filled in)."""
    tools = outside / "bin"
    tools.mkdir()
    marker = outside / "ran-as"
    theirs = _theirs(tools, marker)
    server = outside / "serve"
    shebang = line.format(theirs=theirs, tools=tools, outside=outside)
    server.write_text(f"#!{shebang}\nexec(open({str(FAKE_VLLM)!r}).read())\n")
    server.chmod(0o755)
    shown = (n.format(server=server, theirs=theirs) for n in named)
    refused_as_server(demo, server, marker, *shown, env=env, edit_more=edit_more)


# --- class 1: the exec role's `#!/usr/bin/env` rule (what env runs) ---------------------------------

# Each a shebang line GNU env (coreutils 9.1 here) reads as "run theirpython", where the ninth round's
# reader of env's words found no program, or another one: -S's argument attached to it or in its long
# form, a quoted name (env -S strips quotes), a PATH assigned on the line itself (env looks the name
# up on that PATH, not ours).
SHEBANGS = {
    "attached -S": "-S{theirs}",
    "--split-string=": "--split-string={theirs}",
    "quoted in -S": "-S '{theirs}'",
    "PATH assigned in -S": "-S PATH={tools}:/usr/bin:/bin theirpython",
    # Refused on main (its reader took the second word), kept: env reads -v then -S, whose argument
    # is the rest of the line.
    "-S after another option": "-vS {theirs}",
}


@pytest.mark.parametrize("form", list(SHEBANGS))
def test_the_program_env_runs_is_judged_however_the_shebang_spells_it(
    demo: Demo, outside: Path, form: str
) -> None:
    """`[server] executable` a script of root's whose `#!/usr/bin/env` line, in a form GNU env reads,
    runs a program nobody owns. main: the plan was clean and root's server ran nobody's program (it
    records uid 0, then runs the real fake server)."""
    shebang_refused(demo, outside, f"/usr/bin/env {SHEBANGS[form]}", "/usr/bin/env", "{server}")


@pytest.mark.parametrize("how", ["env", "direct"])
def test_a_chain_of_scripts_is_judged_to_its_end(demo: Demo, outside: Path, how: str) -> None:
    """The exec role followed two `#!` lines. The kernel follows a script's interpreter that is a
    script itself up to five deep, and env runs its program with a fresh execve, so a chain through
    env has no bound at all. Here root's server script runs root's `step1`, which runs root's
    `step2`, which runs nobody's program (`#!/usr/bin/env NAME` lines, or `#!/path` lines). main:
    planned clean; root's server ran nobody's program, both ways."""
    tools = outside / "bin"
    tools.mkdir()
    marker = outside / "ran-as"
    theirs = _theirs(tools, marker)

    def line(name: str) -> str:
        return name if how == "env" else str(tools / name)

    def script(path: Path, runs: str, body: str) -> Path:
        if how == "env":
            return _script(path, runs, body)
        path.write_text(f"#!{runs}\n{body}")
        path.chmod(0o755)
        return path

    script(tools / "step2", str(theirs) if how == "direct" else "theirpython", _STEP)
    script(tools / "step1", line("step2"), _STEP)
    server = script(outside / "serve", line("step1"), f"exec(open({str(FAKE_VLLM)!r}).read())\n")
    refused_as_server(
        demo, server, marker, f"{theirs} is owned by nobody", env={"PATH": f"{tools}:{os.environ['PATH']}"}
    )


def test_the_program_env_runs_is_judged_on_the_servers_path_not_ours(demo: Demo, outside: Path) -> None:
    """The server runs with the PATH the launcher builds: the venv's bin, then `[server] env PATH`
    where the spec sets one (toolchain.path only asks that it start with the venv's bin), then ours.
    The exec role looked the env program up on our PATH alone and judged nothing when it was not
    there. Here the spec's PATH adds a root directory holding a program of nobody's (a tarball's owners
    kept) that root's server script names with `#!/usr/bin/env`. main: planned clean; root's server
    ran nobody's program."""

    def spec_path(doc: Any) -> None:
        doc["server"].setdefault("env", {})["PATH"] = f"{demo.venv}/bin:{outside / 'bin'}:$PATH"

    shebang_refused(
        demo, outside, "/usr/bin/env theirpython", "{theirs} is owned by nobody", edit_more=spec_path
    )
