"""Issue 24's hostile reader, fifteenth round: attacks on what the fourteenth round added (rule A and B of
the exec and value roles, the `-`-leading value rule, a URL's password kept as a hash, the remote-code rule
read as vLLM reads keys, the one-pass reading of a network location), found by reading docs/security.md
and the code alone, each run for real, each seen succeeding on main before its fix unless its docstring
says it was already refused.
"""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import test_hostile_reader13 as round13
from tests.apply_support import FAKE_VLLM, Demo
from tests.ownership_support import NOBODY, NOGROUP
from tests.test_hostile_reader9 import refused_as_server
from tests.test_hostile_reader13 import ROOT_ONLY
from tests.test_hostile_reader14 import _RECORD, top_level

__all__ = ["top_level"]  # the fixture, from the fourteenth round

# --- class 4: a port written with leading zeros ------------------------------------------------------

ZEROS = "0" * 13  # the port's digits run past five; its value is PORT

# (variable, value with PORT for nobody's port); each seen reaching a listener on loopback through the
# tool named (a listener recording the connection, the real tool run with the variable set)
LEADING_ZEROS = [
    ("UV_INDEX_URL", f"http://127.0.0.1:{ZEROS}PORT/simple"),  # uv 0.9 (WHATWG: any number of zeros)
    ("PIP_INDEX_URL", f"http://127.0.0.1:{ZEROS}PORT/simple"),  # pip's urllib3: `:0*?(...)`, urlsplit too
    ("https_proxy", f"127.0.0.1:{ZEROS}PORT"),  # a proxy's bare host:port, read by urlsplit and urllib3
]


@ROOT_ONLY
@pytest.mark.parametrize(("name", "value"), LEADING_ZEROS, ids=["uv-url", "pip-url", "bare-proxy"])
def test_a_port_written_with_leading_zeros_is_held_to_the_listener_rule(
    demo: Demo, strangers: list[int], name: str, value: str
) -> None:
    """Round 14b made a port longer than 5 digits name no location (no tool reaches one past 65535),
    and the bare host:port pattern reads 1 to 5 digits not followed by another. But a port's value is
    not its length: WHATWG's URL standard (uv) and urllib3 (pip, huggingface_hub) and Python's urlsplit
    all read `:00000000000008000` as port 8000 (seen: uv's `--index-url` with 18 digits connected to a
    listener on loopback). main (seen): kept (no line), nobody's listener named by a 6+ digit port."""
    # run as round 13's readings are: nobody listens on PORT, the variable set for `plan`
    round13.test_every_reading_a_tool_makes_of_a_location_is_held_to_the_listener_rule(
        demo, strangers, name, value
    )


# --- class 1: a `#!` line's words as its interpreter reads them -------------------------------------

# Root's server script (beside root's module h15mod.py): it imports h15mod, then runs the fake server.
SERVE_BODY = f"import h15mod\nexec(open({str(FAKE_VLLM)!r}).read())\n".encode()


def plant_pycache(outside: Path, prefix: bytes, marker: Path) -> None:
    """Root's module `outside/h15mod.py`, and `prefix` (a directory made here, nobody's with all it
    holds) holding an unchecked-hash .pyc for it that records who ran it in `marker`: what python runs
    for `import h15mod` from `outside` with that pycache prefix."""
    (outside / "h15mod.py").write_text("pass\n")
    os.mkdir(prefix)
    evil = outside / "evil.py"
    evil.write_text(_RECORD.format(marker=str(marker)))
    cached = prefix + os.fsencode(outside) + f"/h15mod.{sys.implementation.cache_tag}.pyc".encode()
    os.makedirs(os.path.dirname(cached))
    py_compile.compile(
        str(evil), cfile=os.fsdecode(cached), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    evil.unlink()
    for root, dirs, files in os.walk(prefix):
        for entry in [root, *(os.path.join(root, e) for e in dirs + files)]:
            os.chown(entry, NOBODY, NOGROUP)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")
@pytest.mark.parametrize(
    "name",
    [b"ok\x1f-pyc", b"ok\x0b-pyc", b"ok\xc2\xa0-pyc", b"pyc\xff"],
    ids=["x1f", "vt", "nbsp", "not-utf8"],
)
def test_a_shebang_word_is_judged_as_the_bytes_the_interpreter_gets(
    demo: Demo, outside: Path, top_level: Path, name: bytes
) -> None:
    """Rule A judges every word a `#!` line hands its interpreter as a server value. The kernel splits
    that line at a space or a tab only, and hands the interpreter bytes; the rule split the line with
    str.split (which also splits at \\x0b, \\x0c, \\x1c-\\x1f, \\x85, U+00A0 and the other Unicode
    blanks) after decoding it with "replace" (a byte that is not UTF-8 becomes U+FFFD). So
    `-Xpycache_prefix=/<top>/ok<\\x1f>-pyc` was judged as `-Xpycache_prefix=/<top>/ok` (root's
    directory) and `-pyc` (an option naming nothing), and `-Xpycache_prefix=/<top>/pyc<\\xff>` as a
    path that does not exist, while python read nobody's directory of that exact name and the
    unchecked-hash .pyc there for root's module. main (seen): planned clean; root's server ran
    nobody's bytecode (it recorded uid 0)."""
    marker = outside / "ran-as"
    (top_level / "ok").mkdir()  # root's, empty
    prefix = os.fsencode(top_level) + b"/" + name
    plant_pycache(outside, prefix, marker)
    server = outside / "serve"
    server.write_bytes(
        b"#!" + os.fsencode(sys.executable) + b" -Xpycache_prefix=" + prefix + b"\n" + SERVE_BODY
    )
    server.chmod(0o755)
    refused_as_server(demo, server, marker, "[server].executable", "-Xpycache_prefix=")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")
@pytest.mark.parametrize("blank", [" ", "\xa0", "=", ","], ids=["space", "nbsp", "equals", "comma"])
def test_a_servers_value_is_judged_whole_where_a_tool_reads_it_whole(
    demo: Demo, outside: Path, top_level: Path, blank: str
) -> None:
    """The value role reads the paths in a `[server] env` value word by word, splitting at blanks (and
    `:=,;` quotes and brackets) and skipping a word that starts with `-` (a flag). python splits
    PYTHONPATH at `:` only: `PYTHONPATH = "/<top>/ok -lib"` is the one directory `/<top>/ok -lib`, here
    nobody's, holding a sitecustomize.py, beside root's empty `/<top>/ok` (and the same with U+00A0, `=`
    or `,` for the blank). main (seen): planned clean, judged as `/<top>/ok` and the flag `-lib`; root's
    server imported nobody's module (uid 0)."""
    marker = outside / "ran-as"
    (top_level / "ok").mkdir()
    lib = top_level / f"ok{blank}-lib"
    lib.mkdir()
    (lib / "sitecustomize.py").write_text(_RECORD.format(marker=str(marker)))
    for path in (lib, lib / "sitecustomize.py"):
        os.chown(path, NOBODY, NOGROUP)

    def edit(doc: Any) -> None:
        doc["server"].setdefault("env", {})["PYTHONPATH"] = str(lib)

    refused_as_server(demo, None, marker, "PYTHONPATH", edit_more=edit)
