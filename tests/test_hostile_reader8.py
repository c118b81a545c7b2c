"""Issue 24's hostile reader, eighth round, classes 1-3 (the path-trust layer, untrusted trees and
files, the spec's own provenance): attacks on what the seventh round added (the value splitter, the
tools' namespaces in the environment, the bounded venv reads), found by reading docs/security.md and
the code alone, each run for real (a `nobody` directory, real files, a real shared object, a real wheel,
the real CLI and pip), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo
from tests.ownership_support import nobodys_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = pwd.getpwnam("nobody").pw_gid


def _give_to_nobody(*paths: Path) -> None:
    for path in paths:
        os.chown(path, NOBODY, NOGROUP)


# --- class 1: the path-trust layer (the environment root's tools read) ------------------------------


_PROVIDER = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen(MARKER, "a");
    if (f) { fprintf(f, "uid=%d\n", (int)getuid()); fclose(f); }
}
int OSSL_provider_init(void) { return 0; }
"""


def test_an_openssl_config_of_nobodys_never_loads_their_code_into_root(demo: Demo, outside: Path) -> None:
    """The environment rule held the tools' namespaces (UV_, PIP_, GIT_, HF_, XDG_, PYTHON, APT_, ...),
    a list of prefixes, and OpenSSL's is not a tool's: every process that loads libcrypto (Python's
    hashlib and ssl, so reconcile itself, pip, the venv's python) reads the file $OPENSSL_CONF names,
    and that file loads providers: shared objects, run at load. sudo keeps it under `-E` (sudo 1.9.13's
    env_delete strips LD_*, PYTHONPATH, PYTHONHOME, not OPENSSL_*). `sudo -E reconcile plan` with
    nobody's config there runs nobody's code as uid 0. main: nobody's provider ran in reconcile's own
    process (uid=0), in a plan."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the provider")
    theirs = nobodys_dir(outside, "openssl")
    marker = outside / "ran-as"
    source = theirs / "provider.c"
    source.write_text(_PROVIDER)
    library = theirs / "provider.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)], check=True
    )
    conf = theirs / "openssl.cnf"
    conf.write_text(
        "openssl_conf = init\n[init]\nproviders = providers\n[providers]\ntheirs = theirs\n"
        f"default = default\n[default]\nactivate = 1\n[theirs]\nmodule = {library}\nactivate = 1\n"
    )
    _give_to_nobody(source, library, conf)

    run = demo.cli("plan", env={"OPENSSL_CONF": str(conf)})
    assert not marker.exists(), f"nobody's provider ran: {marker.read_text()}; {run.output}"
    assert f"reconcile: environment OPENSSL_CONF left out: {conf}" in run.output, run.output
    assert run.returncode == 2 and "Traceback" not in run.output, run.output


def _wheel(directory: Path, marker: Path) -> Path:
    """ninja 99.0 as a wheel whose `.pth` (an import line) runs at every start of the venv's python."""
    wheel = directory / "ninja-99.0-py3-none-any.whl"
    info = "ninja-99.0.dist-info"
    files = {
        "zz_theirs.pth": f"import os; open({str(marker)!r}, 'a').write('uid=%d\\n' % os.getuid())\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: ninja\nVersion: 99.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: theirs\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def nobodys_index(outside: Path) -> tuple[Path, Path]:
    """A PEP 503 index of nobody's (`<dir>/simple/ninja/`) offering `_wheel`'s ninja 99.0; returns (the
    directory, the marker its `.pth` writes)."""
    theirs = nobodys_dir(outside, "index")
    project = theirs / "simple" / "ninja"
    project.mkdir(parents=True)
    marker = outside / "ran-as"
    wheel = _wheel(project, marker)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body>\n')
    subprocess.run(["chown", "-R", "nobody:nogroup", str(theirs)], check=True)
    return theirs, marker


def test_a_percent_encoded_file_url_in_pip_find_links_never_hands_root_nobodys_wheel(
    demo: Demo, outside: Path
) -> None:
    """The value splitter takes `file:///x` as the path /x, but pip (and uv) unquote a file URL first:
    `file:///%76ar/tmp/<nobody's dir>` is /var/tmp/<nobody's dir> to pip, and `/%76ar/...` (which
    names nothing) to the splitter. `sudo -E reconcile apply` with `PIP_FIND_LINKS` so written hands
    root's pip nobody's wheelhouse: an unlocked install takes the highest version it finds there.
    main: root's venv got nobody's ninja 99.0, and its `.pth` ran as uid 0 at the venv python's next
    start."""
    theirs = nobodys_dir(outside, "wheels")
    marker = outside / "ran-as"
    _give_to_nobody(_wheel(theirs, marker))
    assert str(theirs).startswith("/var/")
    url = "file:///%76ar" + str(theirs)[len("/var") :]

    run = demo.cli("apply", env={"PIP_FIND_LINKS": url}, timeout=300)
    never_installed(demo, run.output, marker)
    assert f"reconcile: environment PIP_FIND_LINKS left out: {url}" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_server_flags_name_cannot_carry_a_value_past_the_value_role(demo: Demo, outside: Path) -> None:
    """The value role looks at the strings of `[server] args` (each value, and every string of a JSON
    flag's table), never at the flag's name: `args = { "download-dir=<nobody's dir>" = true }` renders
    as `--download-dir=<nobody's dir>`, which vLLM's argparse takes as the flag and its value, and
    root's server downloads (and loads) the weights there. A flag's name is now a name (letters,
    digits, '.', '_', '-'), refused at load. main: the plan said nothing about it."""
    theirs = nobodys_dir(outside, "downloads")

    def edit(doc: Any) -> None:
        doc["server"]["args"][f"download-dir={theirs}"] = True

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert "a flag's name is letters, digits" in run.output, run.output
    assert "(download-dir = ...)" in run.output, run.output
    assert "Plan:" not in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_a_json_escaped_path_in_a_server_flags_string_is_held_to_the_value_role(
    demo: Demo, outside: Path
) -> None:
    """A JSON flag may be given as a string (`compilation-config = '{"cache_dir": "..."}'`, as vLLM's
    docs write it); vLLM decodes it with json.loads, so `"\\/var\\/tmp\\/x"` and `"\\u002fvar/tmp/x"`
    are /var/tmp/x to it, while the splitter saw the words `\\/var\\/tmp\\/x` (naming nothing). main:
    the plan said nothing about nobody's compile cache."""
    theirs = nobodys_dir(outside, "compile-cache")
    escaped = str(theirs).replace("/", "\\/")

    def edit(doc: Any) -> None:
        doc["server"]["args"]["compilation-config"] = f'{{"level": 3, "cache_dir": "{escaped}"}}'

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert "[server].args.compilation-config" in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_an_editable_finders_mapping_to_nobodys_directory_fails_the_plan(seeded: Demo, outside: Path) -> None:
    """An editable install of setuptools' finder kind (`pip install -e` of a flat-layout project) puts
    no path in its `.pth`, only `import __editable___x_finder; ....install()`, and the finder module
    (root's, in site-packages) maps the package's name to its source directory (`MAPPING`): every
    import of it in root's server runs what is there. The sixth round holds each directory a `.pth`
    names to the read role, and the finder's MAPPING was left open. main: planned without a word."""
    theirs = nobodys_dir(outside, "src")
    package = theirs / "theirpkg"
    package.mkdir()
    (package / "__init__.py").write_text("import os\n")
    _give_to_nobody(package, package / "__init__.py")
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    finder = site / "__editable___theirpkg_1_0_finder.py"
    finder.write_text(
        "import sys\n"
        f"MAPPING: dict[str, str] = {{'theirpkg': {str(package)!r}}}\n"
        "NAMESPACES: dict[str, list[str]] = {}\n"
        "PATH_PLACEHOLDER = '__editable__.theirpkg-1.0.finder' + '.__path_hook__'\n"
        "def install():\n    pass\n"
    )
    (site / "__editable__.theirpkg-1.0.pth").write_text(
        "import __editable___theirpkg_1_0_finder; __editable___theirpkg_1_0_finder.install()\n"
    )
    run = seeded.cli("plan")
    assert str(package) in run.output and "owned by nobody" in run.output, run.output
    assert finder.name in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def test_a_local_index_of_nobodys_in_the_spec_never_hands_root_their_wheel(demo: Demo, outside: Path) -> None:
    """`[venv] wheelhouse` has the read role (its top level root's or ours), but `index_url` and
    `extra_index_urls` had none: a `file://` index is a wheelhouse under another key, and pip takes
    from it as readily. With one of nobody's (a PEP 503 directory), an unlocked apply installs the
    highest version it offers, and `reconcile lock` would pin nobody's wheels' hashes. main: root's
    venv got nobody's ninja 99.0, whose `.pth` ran as uid 0."""
    theirs, marker = nobodys_index(outside)
    index_refused(demo, f"file://{theirs}/simple", marker)


def index_refused(demo: Demo, url: str, marker: Path) -> None:
    """apply with `[venv] extra_index_urls = [url]`: refused naming the key and nobody, and nobody's
    wheel neither installed nor run (its `marker` never written)."""

    def edit(doc: Any) -> None:
        doc["venv"]["extra_index_urls"] = [url]

    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300)
    never_installed(demo, run.output, marker)
    assert "[venv].extra_index_urls" in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


def never_installed(demo: Demo, output: str, marker: Path) -> None:
    """Root's venv holds no ninja 99.0 (_wheel's) and its `.pth` never ran (`marker` never written)."""
    installed = list(demo.venv.glob("lib/python3*/site-packages/ninja-99.0.dist-info"))
    ran = marker.read_text() if marker.exists() else ""
    assert not installed and not ran, f"root installed nobody's wheel ({ran!r} ran): {output}"


def test_a_dotdot_after_a_link_in_a_value_is_resolved_as_the_kernel_resolves_it(
    demo: Demo, outside: Path
) -> None:
    """A value's path was normalised before it was checked (os.path.normpath: `a/L/../x` is `a/x`),
    but the kernel, and so the server that opens it, resolves `..` from where the link `L` led. nobody
    puts their own link in a sticky directory (as /tmp is) pointing into their directory: the value
    `<sticky>/L/../cache` names `<sticky>/cache` to the check (a missing directory under a sticky
    one: allowed) and nobody's `cache` to the server. main: the plan passed, and root's server wrote
    its compile cache (code it loads next start) into nobody's directory."""
    sticky = outside / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = nobodys_dir(outside, "theirs")
    (theirs / "sub").mkdir()
    _give_to_nobody(theirs / "sub")
    link = sticky / "L"
    link.symlink_to(theirs / "sub")
    os.lchown(link, NOBODY, NOGROUP)

    def edit(doc: Any) -> None:
        doc["server"]["env"]["VLLM_CACHE_ROOT"] = f"{link}/../cache"

    run = demo.cli("apply", spec=demo.write_spec(edit))
    assert not (theirs / "cache").exists(), f"root's server wrote into nobody's directory: {run.output}"
    assert "[server].env.VLLM_CACHE_ROOT" in run.output and "owned by nobody" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_a_pth_import_line_that_runs_a_file_of_nobodys_fails_the_plan(seeded: Demo, outside: Path) -> None:
    """The finder fix above parses the modules a `.pth` import line imports, but the line is code
    itself (coverage's and others' `.pth` files hold a statement, not only an import): `import os;
    exec(open("<nobody's file>").read())` in root's site-packages runs nobody's file at every start
    of the venv's python, root's server included. main: planned without a word (and so on this
    branch after the finder fix, which looked only at the modules such a line imports)."""
    theirs = nobodys_dir(outside, "hooks")
    hook = theirs / "hook.py"
    hook.write_text("pass\n")
    _give_to_nobody(hook)
    (site,) = seeded.venv.glob("lib/python3*/site-packages")
    pth = site / "zz_hook.pth"
    pth.write_text(f"import os; exec(open({str(hook)!r}).read())\n")
    run = seeded.cli("plan")
    assert str(hook) in run.output and "owned by nobody" in run.output, run.output
    assert pth.name in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


# --- class 2: untrusted trees and files (a source that changes while it is copied) -----------------


REWRITER = r"""
import os, sys
name = os.path.join(sys.argv[1], "weights.bin")
size = int(sys.argv[2])
fd = os.open(name, os.O_WRONLY)
print("ready", flush=True)
while True:  # the same file, the same size, other bytes: in place, as its owner may
    for byte in (b"A", b"B"):
        os.pwrite(fd, byte * size, 0)
"""


def test_a_source_file_changed_while_it_is_copied_is_never_recorded_with_another_files_hash(
    outside: Path,
) -> None:
    """The copy hashed a source file from its descriptor, then copied it from the same descriptor: one
    open file, but read twice, and its owner can write it in between. The record then says sha256 H
    (bytes that were read) of a copy holding other bytes; the store names the copy's blob by the
    record (seal_model), so another realization's genuine file with hash H is later hard-linked to
    nobody's bytes, and a deployment whose own source hashes to H takes this copy as "touched", not
    changed. nobody rewrites their file in place (same size) while root copies it. main: a copy whose
    recorded sha256 is not the sha256 of its bytes, within a few copies."""
    import hashlib
    import json
    import sys

    from actions.model import download
    from reconcile.errors import ActionError
    from reconcile.spec.models import Model

    source = nobodys_dir(outside, "source")
    size = 4 << 20
    (source / "weights.bin").write_bytes(b"A" * size)
    (source / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    _give_to_nobody(source / "weights.bin", source / "config.json")
    model_dir = outside / "models" / "m"
    racer = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", REWRITER,
         str(source), str(size)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lies = []
    try:
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        for _ in range(40):
            try:
                download(Model(source=str(source), dir=str(model_dir)), progress=False)
            except ActionError as exc:
                assert "changed while it was copied" in str(exc), exc
                continue
            record = json.loads((model_dir / ".reconcile-model.json").read_text())
            said = record["source_files"]["weights.bin"]["sha256"]
            held = hashlib.sha256((model_dir / "weights.bin").read_bytes()).hexdigest()
            if said != held:
                lies.append((said, held))
                break
    finally:
        racer.kill()
        racer.wait()
    assert lies == [], "the record names bytes the copy does not hold"
