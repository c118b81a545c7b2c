"""Issue 24's hostile reader, eighteenth round: what round 17 added (the installers' own config files
and caches, the interpreter's standard library check, the new value rules, the hard-linked key). Read
as `nobody` (or the owner of a file in an interpreter's install unpacked with its archive's owners, round
3's premise) with only docs/security.md and the code. Each attack runs for real; each was seen
succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader9 import _standalone_python, applied_with_python
from tests.test_hostile_reader17a import _nobodys_venv_module

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (builds a program and a library)"),
]

# A launcher as python-build-standalone's and pyenv's shared builds are: `main` calls libpython's
# Py_BytesMain, and the dynamic loader finds libpython3.X.so.1.0 through the program's RUNPATH.
_MAIN = "int Py_BytesMain(int, char **);\nint main(int c, char **v) { return Py_BytesMain(c, v); }\n"
# What nobody puts at that name: a library whose constructor records who loaded it.
_THEIRS = """#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen("%s", "a"); if (f) { fprintf(f, "uid=%%d\\n", (int)getuid()); fclose(f); }
}
int Py_BytesMain(int c, char **v) { (void)c; (void)v; return 1; }
"""


def _gcc(out: Path, source: str, *flags: str) -> None:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-o", str(out), str(src), *flags], check=True, capture_output=True)
    src.unlink()


def _shared_python(base: Path, runpath: str) -> Path:
    """A standalone install's program at base/bin/python3 (root's, 0755), linked against this python's
    libpython with `runpath` as its RUNPATH (`$ORIGIN/../lib`: python-build-standalone's)."""
    (base / "bin").mkdir(parents=True)
    (base / "lib").mkdir()
    program = base / "bin" / "python3"
    libdir = sysconfig.get_config_var("LIBDIR")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    _gcc(program, _MAIN, f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{runpath},--enable-new-dtags")
    return program


def _theirs(path: Path, marker: Path) -> None:
    """nobody's shared library at `path` (its directory root's)."""
    _gcc(path, _THEIRS % marker, "-shared", "-fPIC")
    os.chown(path, NOBODY, NOGROUP)


# --- the interpreter's shared library, found through its RUNPATH -----------------------------------------


def test_a_libpython_of_nobodys_beside_the_specs_interpreter_never_loads_when_root_makes_the_venv(
    demo: Demo, outside: Path
) -> None:
    """Round 17 held `[venv] python`'s standard library to the read role (`library_problem`), but a
    shared build (pyenv's, python-build-standalone's) is a small program whose interpreter is
    `libpython3.X.so.1.0`, which the dynamic loader finds through the program's RUNPATH
    (`$ORIGIN/../lib`) before the system's directories: `<prefix>/lib/libpython3.X.so.1.0`, beside the
    standard library, not in it. An install unpacked with its archive's owners kept: root's program and
    directories, that one file nobody's. main: apply's `python -I -S -m venv` loaded nobody's library,
    whose constructor ran as uid 0."""
    base = outside / "python"
    program = _shared_python(base, "$ORIGIN/../lib")
    marker = outside / "ran-as"
    _theirs(base / "lib" / sysconfig.get_config_var("INSTSONAME"), marker)

    output = applied_with_python(demo, program, marker)
    assert "is owned by nobody" in output, output


# What nobody puts at a program's PT_INTERP: a static "loader" that records who ran it (raw x86-64 system
# calls: getuid, open, write, exit) and runs nothing else.
_LOADER = r"""
static long sys(long n, long a, long b, long c) {
    long r;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static const char path[] = "%s";
void _start(void) {
    char buf[16] = "uid=";
    long uid = sys(102, 0, 0, 0), i = 4, d = 1;
    while (d * 10 <= uid) d *= 10;
    for (; d; d /= 10) buf[i++] = '0' + (uid / d) %% 10;
    buf[i++] = '\n';
    sys(1, sys(2, (long)path, 02101, 0644), (long)buf, i);
    sys(60, 0, 0, 0);
}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the planted loader is x86-64 code")
def test_a_program_interpreter_of_nobodys_never_runs_when_root_makes_the_venv(
    demo: Demo, outside: Path
) -> None:
    """The same rule's other member: what the kernel itself maps for an ELF program, its PT_INTERP (the
    dynamic loader it names, `/lib64/ld-linux-x86-64.so.2` as a rule). `[venv] python` root's program
    (with no library near it: nothing for library_problem to judge) linked with `--dynamic-linker` a file
    in nobody's directory. main: apply's `python -I -S -m venv` ran nobody's loader as uid 0."""
    theirs = nobodys_dir(outside, "theirs")
    marker = outside / "ran-as"
    _gcc(theirs / "ld.so", _LOADER % marker, "-static", "-nostdlib", "-fno-stack-protector", "-O1")
    os.chown(theirs / "ld.so", NOBODY, NOGROUP)
    program = outside / "python" / "bin" / "python3"
    program.parent.mkdir(parents=True)
    _gcc(program, "int main(void) { return 0; }\n", f"-Wl,--dynamic-linker={theirs / 'ld.so'}")

    output = applied_with_python(demo, program, marker)
    assert "owned by nobody" in output, output


def test_an_interpreter_whose_shared_library_is_roots_alone_passes(outside: Path) -> None:
    """The fix's other side: the same install with root's copy of libpython, and the interpreter running
    these tests (pyenv's shared build: RUNPATH <prefix>/lib, root's), pass the exec role."""
    from reconcile.safety.filesafety import resolve_exec

    base = outside / "python"
    program = _shared_python(base, "$ORIGIN/../lib")
    name = sysconfig.get_config_var("INSTSONAME")
    shutil.copy2(Path(sysconfig.get_config_var("LIBDIR")) / name, base / "lib" / name)
    assert subprocess.run([program, "-I", "-S", "-c", "pass"], check=False).returncode == 0
    assert resolve_exec(str(program)) == str(program)
    real = os.path.realpath(sys._base_executable)  # type: ignore[attr-defined]
    assert resolve_exec(real) == real


# --- the interpreter's standard library, where its pyvenv.cfg's `home` puts it ---------------------------


def copied_venv(outside: Path) -> tuple[Path, Path, Path, Path]:
    """(standalone python, venv, marker, init): a venv made with `--copies` from round 17's standalone
    install (root's), whose `venv/__init__.py` is nobody's and records who ran it in `marker`."""
    base = outside / "base"
    base.mkdir()
    python = _standalone_python(base, outside / "pth-ran-as")
    copied = outside / "copied"
    subprocess.run([python, "-I", "-S", "-m", "venv", "--copies", "--without-pip", copied], check=True)
    marker = outside / "ran-as"
    return python, copied, marker, _nobodys_venv_module(python, marker)


def test_a_module_of_nobodys_in_the_library_a_copied_venvs_home_names_never_runs_when_root_makes_the_venv(
    demo: Demo, outside: Path
) -> None:
    """Round 17 judged the standard library under the program's own prefix and a pyvenv.cfg beside it
    (or one up) as a file. `[venv] python` a venv's python made with `--copies` (a regular file, root's):
    its prefix holds no standard library; python reads its pyvenv.cfg's `home` and takes the library
    from the install there, which nothing judged. That install unpacked with its archive's owners kept,
    its `venv/__init__.py` nobody's. main: apply's `python -I -S -m venv` ran nobody's line as uid 0."""
    _, copied, marker, init = copied_venv(outside)

    def edit(doc: Any) -> None:
        doc["venv"]["python"] = str(copied / "bin" / "python3")

    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300)
    ran = marker.read_text() if marker.exists() else ""
    assert not ran, f"nobody's venv module ran ({ran!r}): {run.output}"
    assert f"{init} is owned by nobody" in run.output and "Traceback" not in run.output, run.output


# --- setuptools' own config file, read when pip or uv build an sdist ---------------------------------------


def _sdist(wheelhouse: Path) -> None:
    """toy 1.0 as an sdist (setuptools' build backend, one package whose module says whose it is) beside
    setuptools' wheel: what an unlocked install builds from a wheelhouse of root's (round 5's choice)."""
    import io
    import tarfile

    files = {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n'
        '[project]\nname = "toy"\nversion = "1.0"\n[tool.setuptools]\npackages = ["toy"]\n',
        "toy/__init__.py": "WHOSE = 'roots'\n",
    }
    with tarfile.open(wheelhouse / "toy-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"toy-1.0/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    shutil.copy(next(Path("/opt/pypi/files").glob("setuptools-*.whl")), wheelhouse)


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_setuptools_config_of_nobodys_in_roots_home_never_steers_the_build_of_what_root_installs(
    demo: Demo, outside: Path, installer: str
) -> None:
    """Round 17 held the config files pip and uv read by default to the read role; the build backend they
    run for an sdist reads its own: setuptools (its distutils) reads `$HOME/.pydistutils.cfg` at every
    build. Under `sudo -E` HOME is root's, that one file nobody's (a dotfiles copy that kept its owner):
    `[build] build_base = <nobody's dir>`, where nobody left `lib/toy/__init__.py` dated in the future;
    distutils copies a module into build_lib only when the copy there is older, so the wheel packs
    nobody's. main: root's venv got nobody's module (pip and uv alike)."""
    home = outside / "home"
    home.mkdir()
    theirs = outside / "build"
    theirs.mkdir()
    planted = theirs / "lib" / "toy" / "__init__.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("WHOSE = 'nobodys'\n")
    os.utime(planted, (2_000_000_000, 2_000_000_000))
    subprocess.run(["chown", "-R", "nobody:nogroup", str(theirs)], check=True)
    (home / ".pydistutils.cfg").write_text(f"[build]\nbuild_base = {theirs}\n")
    os.chown(home / ".pydistutils.cfg", NOBODY, NOGROUP)
    wheelhouse = outside / "wheelhouse"
    wheelhouse.mkdir()
    _sdist(wheelhouse)

    def edit(doc: Any) -> None:
        doc["venv"]["installer"] = installer
        doc["venv"]["wheelhouse"] = str(wheelhouse)
        doc["venv"]["packages"] = {"toy": "*"}

    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = demo.cli("apply", spec=demo.write_spec(edit), timeout=300, env=env)
    installed = list(demo.venv.glob("lib/python3*/site-packages/toy/__init__.py"))
    assert not [p for p in installed if "nobodys" in p.read_text()], run.output
    assert f"{home}/.pydistutils.cfg" in run.output and "owned by nobody" in run.output, run.output
    assert run.returncode == 1 and "Traceback" not in run.output, run.output


# --- class 6: a record whose strings hold other JSON than the reader expects ------------------------------


@pytest.mark.parametrize("shown", ["[1, null]", '[["vllm"]]'])
def test_a_server_record_whose_argv_is_not_strings_words_a_restart_without_a_traceback(
    seeded: Demo, shown: str
) -> None:
    """The server record's reader checks its shape (components: a map of strings), but `argv.shown` is a
    JSON string inside it, read again when the plan words why the server restarts (`explain_change`).
    A record damaged there (a hand edit, a disk's error, an older writer) with a list of other things
    than strings, and a spec change that restarts the server. main: `reconcile plan` (and so apply,
    which plans first): `reconcile: internal error: AttributeError: 'int' object has no attribute
    'startswith' (this is a bug; ...)`, exit 1, at every run until the record was removed by hand."""
    assert seeded.cli("apply").returncode == 2
    record = next(seeded.state_dir.glob("server-*.json"))
    data = json.loads(record.read_text())
    data["components"]["argv"] = "damaged"
    data["components"]["argv.shown"] = shown
    record.write_text(json.dumps(data))

    def edit(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = 3

    seeded.write_spec(edit)
    for command in ("plan", "apply"):
        run = seeded.cli(command)
        assert "Traceback" not in run.output and run.returncode == 2, run.output
        assert "args changed" in run.output, run.output
