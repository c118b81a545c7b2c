"""Issue 24's hostile reader, twelfth round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what rounds 9-11 added, first the exec role's reading of
`#!` lines and the PATH it looks on, then the value role's reading of relative words, found by reading
docs/security.md and the code alone, each run for real (`nobody`'s files in root directories, real
scripts, GNU coreutils, the real CLI and the fake vLLM server), each seen succeeding on main before its
fix.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader8 import index_refused, never_installed, nobodys_index
from tests.test_hostile_reader9 import refused_as_server
from tests.test_hostile_reader10 import shebang_refused
from tests.test_hostile_reader11 import HUB, run_hub

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

# --- class 1: the exec role's `#!` reading (what an interpreter runs) ---------------------------------


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("/usr/bin/nice theirpython", id="nice"),
        pytest.param("/usr/bin/nohup theirpython", id="nohup"),
        pytest.param("{outside}/run -S theirpython", id="env by another name"),
        pytest.param("/usr/bin/env -S nice theirpython", id="env -S running nice"),
    ],
)
def test_a_program_an_interpreter_runs_by_name_is_judged_or_refused(
    demo: Demo, outside: Path, line: str
) -> None:
    """`[server] executable` a script of root's whose `#!` interpreter is root's program that runs
    another by name (nice, nohup; env under another name; env -S running nice), that name being a
    program of nobody's in a root directory on PATH (a tarball's owners kept, round 3's premise).
    Rounds 9 and 10 judged the program of `#!.../env NAME` only, env known by the name on the line.
    main: planned clean; root's server ran nobody's program (it records uid 0, then runs the fake
    server)."""
    os.symlink("/usr/bin/env", outside / "run")  # root's link, in root's directory
    env = {"PATH": f"{outside / 'bin'}:{os.environ['PATH']}"}
    shebang_refused(demo, outside, line, "{server}", env=env)


def test_a_relative_interpreter_on_a_shebang_line_is_refused(demo: Demo, outside: Path) -> None:
    """The kernel resolves a relative `#!` interpreter from the process's working directory, "/" for
    the server; the exec role's walk resolved it from reconcile's own (the timer's unit runs in the
    spec's directory; here the demo's root), so a root's file at that relative path there passed while
    the server ran nobody's at the same path under "/". main: planned clean; root's server ran nobody's
    program."""
    relative = str((outside / "bin" / "theirpython").relative_to("/"))
    decoy = demo.root / relative  # root's, where reconcile's working directory puts the name
    decoy.parent.mkdir(parents=True)
    decoy.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    decoy.chmod(0o755)
    shebang_refused(demo, outside, relative, "{server}", relative)


def test_a_relative_entry_in_the_servers_path_is_refused(demo: Demo, outside: Path) -> None:
    """Round 10 left it open: `[server] env PATH = "<venv>/bin:var/tmp/x/bin:$PATH"`. The server runs
    in "/", so env finds `theirpython` in /var/tmp/x/bin; the exec role's lookup (shutil.which on that
    PATH) resolved the relative entry from reconcile's own working directory, found nothing there and
    judged nothing. The value role judged the directory /var/tmp/x/bin (root's: it passes), not the
    program in it. main: planned clean; root's server ran nobody's program."""
    relative = str((outside / "bin").relative_to("/"))

    def spec_path(doc: Any) -> None:
        doc["server"].setdefault("env", {})["PATH"] = f"{demo.venv}/bin:{relative}:$PATH"

    shebang_refused(
        demo, outside, "/usr/bin/env theirpython", "server.env.PATH", relative, edit_more=spec_path
    )


# --- class 1: the value role (a relative word that climbs; what a directory holds) ----------------------


def test_a_relative_value_that_climbs_out_of_a_missing_directory_is_judged(demo: Demo, outside: Path) -> None:
    """The value role reads a relative word as a path when its first component exists under "/" (so a
    hub id `org/model` is not one). `VLLM_CACHE_ROOT = "<new>/../var/tmp/<nobody's dir>"`: `<new>` does
    not exist, so the word was not a path; the server (in "/") makes `<new>` with its cache
    (os.makedirs), and the kernel then takes `..` back to "/", or a tool normalises it first: the cache
    is nobody's directory all the same, and their link sends root's compile cache where they choose.
    main: root's server wrote its compile cache through nobody's link into a root-only directory. Now a
    paths.owner error (in the kernel's form: `<new>` is missing with `..` after it)."""
    theirs = nobodys_dir(outside, "vllm-cache")
    target = outside / "root-only"
    target.mkdir(mode=0o700)
    os.symlink(target, theirs / "torch_compile_cache")
    os.lchown(theirs / "torch_compile_cache", NOBODY, NOGROUP)
    new = f"reconcile-h12-{uuid.uuid4().hex[:8]}"
    value = f"{new}/../{theirs.relative_to('/')}"

    def edit(doc: Any) -> None:
        doc["server"]["env"]["VLLM_CACHE_ROOT"] = value

    try:
        run = demo.cli("apply", spec=demo.write_spec(edit))
    finally:
        shutil.rmtree(f"/{new}", ignore_errors=True)
    assert sorted(p.name for p in target.iterdir()) == [], f"root's server wrote there: {run.output}"
    assert "[server].env.VLLM_CACHE_ROOT" in run.output and "[paths.owner]" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_a_directory_the_server_imports_from_is_judged_with_what_it_holds(demo: Demo, outside: Path) -> None:
    """The value role held a directory a `[server] env` value names to the write-dir role: the
    directory itself root's and writable by no one else, not what it holds. `PYTHONPATH` (like
    `LD_LIBRARY_PATH`, or a cache whose artifacts are loaded as code) names a directory the server
    loads code from: a root directory holding a module of nobody's (a tarball's owners kept, round 3's
    premise) passed. main: planned clean; root's server imported nobody's `sitecustomize.py`, which
    recorded uid 0."""
    lib = outside / "lib"
    lib.mkdir()
    marker = outside / "ran-as"
    module = lib / "sitecustomize.py"
    module.write_text(f"import os\nopen({str(marker)!r}, 'a').write(f'uid={{os.getuid()}}\\n')\n")
    os.chown(module, NOBODY, NOGROUP)

    def edit(doc: Any) -> None:
        doc["server"]["env"]["PYTHONPATH"] = str(lib)

    refused_as_server(
        demo, None, marker, "[server].env.PYTHONPATH", f"{module} is owned by nobody", edit_more=edit
    )


# --- class 1: a file URL's scheme, as pip reads it -----------------------------------------------------


@pytest.mark.parametrize("scheme", ["FILE", "File"])
def test_a_file_url_in_capitals_in_the_specs_index_is_held_to_the_index_role(
    demo: Demo, outside: Path, scheme: str
) -> None:
    """A URL's scheme is case-insensitive (RFC 3986 3.1), and pip reads `FILE:///x` as the local index
    /x; the value splitter knew `file:` in lower case only, and took `FILE://...` for a remote URL,
    which names no path (a remote index is the spec's choice). main: `extra_index_urls =
    ["FILE://<nobody's index>"]` planned clean; the unlocked apply installed nobody's ninja 99.0,
    whose `.pth` ran as uid 0."""
    theirs, marker = nobodys_index(outside)
    index_refused(demo, f"{scheme}://{theirs}/simple", marker)


def test_a_file_url_in_capitals_in_the_environment_is_left_out(demo: Demo, outside: Path) -> None:
    """The same URL in the environment `sudo -E` hands over: `PIP_INDEX_URL=FILE:///<nobody's index>`.
    main: the environment check let it through (no path in it); root's apply installed nobody's ninja
    99.0, whose `.pth` ran as uid 0."""
    theirs, marker = nobodys_index(outside)
    url = f"FILE://{theirs}/simple"
    run = demo.cli("apply", env={"PIP_INDEX_URL": url}, timeout=300)
    never_installed(demo, run.output, marker)
    assert f"reconcile: environment PIP_INDEX_URL left out: {url}" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_config_directory_the_environment_names_is_judged_with_what_it_holds(
    demo: Demo, outside: Path
) -> None:
    """The environment's rule judged a directory a variable names as a directory (write-dir: root's or
    ours, writable by no one else), not what it holds. pip reads `<each XDG_CONFIG_DIRS entry>/pip/
    pip.conf` as its site-wide config: `sudo -E reconcile apply` with `XDG_CONFIG_DIRS=/etc/xdg:<a root
    directory>` whose `pip/pip.conf` is nobody's (a tarball's owners kept) names nobody's index.
    main: the variable was kept; root's pip installed nobody's ninja 99.0, whose `.pth` ran as uid 0."""
    theirs, marker = nobodys_index(outside)
    config = outside / "xdg" / "pip" / "pip.conf"
    config.parent.mkdir(parents=True)
    config.write_text(f"[global]\nindex-url = file://{theirs}/simple\n")
    os.chown(config, NOBODY, NOGROUP)
    value = f"/etc/xdg:{outside / 'xdg'}"
    run = demo.cli("apply", env={"XDG_CONFIG_DIRS": value}, timeout=300)
    never_installed(demo, run.output, marker)
    assert (
        f"reconcile: environment XDG_CONFIG_DIRS left out: {value}: {config} is owned by nobody" in run.output
    )
    assert "Traceback" not in run.output, run.output


# --- class 5 (a name from outside judged by a pattern): `$` before a final newline --------------------

# Round 11's hub on loopback (tests/test_hostile_reader11.HUB), asked by the plan's probe instead of
# apply's download: probes.hub.listing, the preflight's weights fact.
_PROBE = """
from probes.hub import listing
got = listing("o/m", "main", sys.argv[2], offline=False)
said = getattr(got, "commit", "") or got.reason
print("listed:" if hasattr(got, "commit") else "refused:", json.dumps(said))
"""


@pytest.mark.parametrize(("sha", "taken"), [("a" * 40, True), ("a" * 40 + "\n", False)])
def test_the_plans_hub_probe_takes_forty_hex_digits_and_nothing_after_them(
    tmp_path: Path, sha: str, taken: bool
) -> None:
    """Round 11 made apply's listing (actions.model) refuse a hub sha with a trailing newline; the plan's
    own probe (probes.hub, which the preflight asks for a model's weights) kept `^[0-9a-f]{40}$`. main
    (seen): `"sha": "<40 hex>\\n"` passed the pattern, the listing was cached under the branch with that
    commit, then `cache_path` refused the commit as a file name: `ValueError`, an internal error in every
    plan of a hub model with no local files. Now refused as a hub answering without a commit, nothing
    cached; a plain sha is still taken."""
    cache = tmp_path / "cache"
    run = run_hub(tmp_path, HUB.split("from actions.model import _listing")[0] + _PROBE, sha, str(cache))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    cached = [p.read_text() for p in cache.rglob("*.json")] if cache.exists() else []
    if taken:
        assert run.stdout == f"listed: {json.dumps(sha)}\n", run.stdout
        assert cached and all(json.loads(c)["commit"] == sha for c in cached), cached
    else:
        assert run.stdout.startswith('refused: "the hub answered without a commit'), run.stdout
        assert cached == [], cached


_RE_CALLS = {"compile", "match", "search", "fullmatch", "sub", "subn", "split", "findall", "finditer"}


def _dollar_patterns(tree: ast.Module) -> list[tuple[int, str]]:
    """Each regular expression of a module handed to `re` (a literal, or a module-level name bound to
    one, or a `(..., pattern, ...)` table the module compiles) that ends in an unescaped `$` without
    re.M: (line, pattern)."""
    names = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in _RE_CALLS
            and node.args
        ):
            continue
        if any("M" in ast.unparse(a) for a in (*node.args[1:], *(k.value for k in node.keywords))):
            continue  # re.M / re.MULTILINE: `$` is each line's end, meant
        arg = node.args[0]
        pattern = arg.value if isinstance(arg, ast.Constant) else names.get(getattr(arg, "id", ""))
        if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
            found.append((node.lineno, pattern))
    return found


def test_no_pattern_that_judges_a_name_lets_a_trailing_newline_through() -> None:
    """Python's `$` matches at the end and before a final newline: `re.match(r"^[0-9a-f]{40}$", sha)`
    takes `"<sha>\\n"`. Round 11 fixed three patterns, the plan's hub probe kept a fourth (above); the
    class is every pattern handed to `re` in reconcile's code, whatever it judges (a hub's sha, a file
    name in a source or a listing, a temp file's name in a directory the key's owner owns, a state
    file's, a line of output): each ends in `\\Z` (or uses re.M, where `$` is each line's end). A
    pydantic `pattern=` is Rust's regex, whose `$` is the end of the text only: not listed."""
    root = Path(__file__).resolve().parent.parent
    found = [
        f"{path.relative_to(root)}:{line}: {pattern}"
        for package in ("reconcile", "probes", "actions")
        for path in sorted((root / package).rglob("*.py"))
        for line, pattern in _dollar_patterns(ast.parse(path.read_text(), str(path)))
    ]
    assert found == [], "\n".join(found)


def test_uvs_shared_cache_lock_is_no_reason_to_leave_its_cache_out(tmp_path: Path) -> None:
    """uv makes its cache's `.lock` 0666 whatever the umask (users may share a cache); the three-level
    rule above left every uv cache out at every start after the first `reconcile lock` (seen in
    tests/test_lock_closure.py: `XDG_CACHE_HOME left out: .../cache/uv/.lock is writable by others`).
    An empty lock is flocked, never read: it passes; one that holds bytes is judged as any file is."""
    import shutil
    import subprocess
    import sys

    from reconcile.safety.filesafety import trusted_environment

    cache = tmp_path / "cache"
    uv = shutil.which("uv", path=os.path.dirname(sys.executable)) or "uv"
    env = {**os.environ, "UV_CACHE_DIR": str(cache)}
    made = subprocess.run(
        [uv, "pip", "compile", "--no-index", "-"], input="", env=env, capture_output=True, timeout=60
    )
    assert made.returncode == 0, made
    lock = cache / ".lock"
    assert lock.stat().st_mode & 0o777 == 0o666, oct(lock.stat().st_mode)
    assert trusted_environment({"UV_CACHE_DIR": str(cache)}) == ({}, [])
    lock.write_text("x")
    changes, notes = trusted_environment({"UV_CACHE_DIR": str(cache)})
    assert changes == {"UV_CACHE_DIR": None} and f"{lock} is writable by others" in notes[0], notes
