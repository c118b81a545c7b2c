"""Issue 24's hostile reader, fourteenth round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what round 12a added, first the exec role's `#!` rule
(the words on a `#!` line must be options), found by reading docs/security.md and the code alone, each
run for real (`nobody`'s files in root directories, real scripts, GNU env, the real CLI and the fake
vLLM server), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import FAKE_VLLM, Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader9 import refused_as_server
from tests.test_hostile_reader10 import shebang_refused

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

# What nobody's code does when root runs it: record the uid it ran as.
_RECORD = "import os\nopen({marker!r}, 'a').write(f'uid={{os.getuid()}}\\n')\n"


def _server(outside: Path, shebang: str, body: str = "") -> Path:
    """Root's `[server] executable`: a python script of root's in the root directory `outside` whose
    `#!` line is `shebang`, that runs the fake server."""
    server = outside / "serve"
    server.write_text(f"#!{shebang}\n{body}exec(open({str(FAKE_VLLM)!r}).read())\n")
    server.chmod(0o755)
    return server


# --- class 1: what an option or an assignment on a `#!` line names ------------------------------------


@pytest.mark.parametrize("variable", ["PYTHONPATH", "LD_PRELOAD"])
def test_an_assignment_env_s_makes_on_a_shebang_line_is_judged_as_a_servers_value(
    demo: Demo, outside: Path, variable: str
) -> None:
    """Round 12's rule reads `#!/usr/bin/env -S NAME=VALUE... PROGRAM`: it refuses PATH set there, and
    skips every other assignment. GNU env sets them for the program: `PYTHONPATH=<dir>` makes python
    import `sitecustomize` from there, `LD_PRELOAD=<file>` makes ld.so load it into any program. Here
    the directory is nobody's (or holds nobody's module), the program root's own python. main: planned
    clean; root's server ran nobody's code (it recorded uid 0). A `[server] env` value of the same
    text is held to the value role (round 12); the same value on the `#!` line now is too."""
    marker = outside / "ran-as"
    lib = nobodys_dir(outside, "lib")
    if variable == "PYTHONPATH":
        (lib / "sitecustomize.py").write_text(_RECORD.format(marker=str(marker)))
        value = str(lib)
    else:
        source = lib / "preload.c"
        source.write_text(
            "#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) static void r(void)"
            f' {{ FILE *f = fopen("{marker}", "a"); if (f) {{ fprintf(f, "uid=%d\\n", getuid());'
            " fclose(f); } }\n"
        )
        value = str(lib / "preload.so")
        if shutil.which("cc") is None:
            pytest.skip("no C compiler to build the preloaded object")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", value, str(source)], check=True)
    for path in lib.iterdir():
        os.chown(path, NOBODY, NOGROUP)
    server = _server(outside, f"/usr/bin/env -S {variable}={value} {sys.executable}")
    refused_as_server(demo, server, marker, "[server].executable", f"{variable}={value}")


def test_an_option_naming_a_directory_on_a_shebang_line_is_judged(demo: Demo, outside: Path) -> None:
    """An option may carry a path attached to it (the kernel hands the rest of the `#!` line as one
    word): `#!python -Xpycache_prefix=<dir>` makes python read every module's bytecode from below that
    directory instead of beside the source, and an unchecked-hash .pyc there is taken without looking
    at the source at all. Here the directory is nobody's and holds such a .pyc for a module of root's
    beside the server. main: `-X...` is an option, so planned clean; root's server ran nobody's
    bytecode (it recorded uid 0)."""
    marker = outside / "ran-as"
    (outside / "h14mod.py").write_text("pass\n")  # root's module, beside root's server script
    prefix = nobodys_dir(outside, "pyc")
    evil = outside / "evil.py"
    evil.write_text(_RECORD.format(marker=str(marker)))
    cached = f"{prefix}{outside}/h14mod.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(
        str(evil), cfile=cached, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    evil.unlink()
    for path in [*prefix.rglob("*")]:
        os.chown(path, NOBODY, NOGROUP)
    server = _server(outside, f"{sys.executable} -Xpycache_prefix={prefix}", "import h14mod\n")
    refused_as_server(demo, server, marker, "[server].executable", f"-Xpycache_prefix={prefix}")


@pytest.fixture
def top_level() -> Iterator[Path]:
    """A root directory of root's at "/" (the server's working directory), removed after the test."""
    path = Path(f"/reconcile-h14-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_module_an_option_names_from_the_servers_working_directory_is_judged(
    demo: Demo, outside: Path, top_level: Path
) -> None:
    """Letters only, no path: `#!python -m<name>`. python runs the module `<name>` looked up first in
    its working directory ("/" for the server), and a directory without `__init__.py` is a namespace
    package whose `__main__.py` runs. Here `/<name>` is root's and holds nobody's `__main__.py` (a
    tarball's owners kept, round 3's premise; `-mtmp` reads /tmp/__main__.py, anyone's). main: `-m...`
    is an option, so planned clean; root's server ran nobody's module (it recorded uid 0)."""
    marker = outside / "ran-as"
    main = top_level / "__main__.py"
    main.write_text(_RECORD.format(marker=str(marker)) + f"exec(open({str(FAKE_VLLM)!r}).read())\n")
    os.chown(main, NOBODY, NOGROUP)
    server = _server(outside, f"{sys.executable} -m{top_level.name}")
    refused_as_server(demo, server, marker, "[server].executable", f"{main} is owned by nobody")


# env's -S with its argument attached, after another option, and in its long form.
@pytest.mark.parametrize("words", ["-Stheirpython", "-vStheirpython", "--split-string=theirpython"])
def test_a_program_an_option_names_is_judged_whatever_the_interpreter_is_called(
    demo: Demo, outside: Path, words: str
) -> None:
    """Round 12 knows env by the name on the line or the one its links lead to, and reads env's own
    forms (`-S<name>`, `--split-string=<name>`) only then; any other interpreter gets "options only".
    A copy of env (or a hard link: no link to follow) is env under another name: `#!<dir>/run
    -Stheirpython` hands it one option, which runs `theirpython` found on the server's PATH, nobody's
    (in a root directory, a tarball's owners kept). main: planned clean; root's server ran nobody's
    program (it recorded uid 0)."""
    shutil.copy2("/usr/bin/env", outside / "run")  # root's copy, in root's directory
    env = {"PATH": f"{outside / 'bin'}:{os.environ['PATH']}"}
    shebang_refused(
        demo, outside, f"{{outside}}/run {words}", "{server}", "{theirs} is owned by nobody", env=env
    )


# --- class 1: the value role's whole-tree walk (what a link in the tree leads to) ------------------------


def test_a_directory_a_link_in_a_walked_tree_leads_to_is_walked_too(demo: Demo, outside: Path) -> None:
    """Round 12 holds a directory a `[server] env` value names to the read role over its whole tree, each
    link in it "judged as the path itself, not descended into": the link, its directory and its target
    root's and not writable by others, but not what a target directory holds. `PYTHONPATH=<lib>`, root's,
    holds root's link `sitecustomize -> <pkg>`, a root directory holding nobody's `__init__.py` (a
    tarball's owners kept, round 3's premise): python imports the package `sitecustomize` through the
    link. main: planned clean; root's server ran nobody's module (it recorded uid 0)."""
    marker = outside / "ran-as"
    lib, pkg = outside / "lib", outside / "pkg"
    lib.mkdir()
    pkg.mkdir()
    init = pkg / "__init__.py"
    init.write_text(_RECORD.format(marker=str(marker)))
    os.chown(init, NOBODY, NOGROUP)
    os.symlink(pkg, lib / "sitecustomize")

    def edit(doc: Any) -> None:
        doc["server"]["env"]["PYTHONPATH"] = str(lib)

    refused_as_server(
        demo, None, marker, "[server].env.PYTHONPATH", f"{init} is owned by nobody", edit_more=edit
    )
