"""Issue 24's hostile reader, nineteenth round: what round 18 added (the exec role's reading of an ELF
program's headers, reconcile/safety/elf.py) and the `beside` change (the listeners a connection to the
server's host reaches). Read as `nobody` (or the owner of one file in an interpreter's install unpacked
with its archive's owners, round 3's premise) with only docs/security.md and the code. Each attack runs
for real; each was seen succeeding on main before its fix unless its docstring says otherwise.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader9 import applied_with_python
from tests.test_hostile_reader18 import _THEIRS, _gcc, _shared_python, _theirs, copied_venv

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (builds a program and a library)"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the headers are patched as ELF64 LSB"),
]

# --- an ELF program whose headers the reader reads otherwise than the kernel and the loader --------------

_PHDR = "<IIQQQQQQ"  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
_PT_LOAD, _PT_DYNAMIC, _PT_NOTE = 1, 2, 4


def _headers(data: bytearray) -> list[tuple[int, list[int]]]:
    """(where, fields) of each program header of an ELF64 LSB file."""
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    size, count = struct.unpack_from("<HH", data, 0x36)
    return [
        (at, list(struct.unpack_from(_PHDR, data, at))) for at in range(phoff, phoff + size * count, size)
    ]


def _strtab(data: bytearray) -> int:
    """DT_STRTAB's address, from the one PT_DYNAMIC a linker writes."""
    offset = next(f[2] for _, f in _headers(data) if f[0] == _PT_DYNAMIC)
    while (entry := struct.unpack_from("<qQ", data, offset))[0] != 0:
        if entry[0] == 5:
            return entry[1]
        offset += 16
    raise AssertionError("no DT_STRTAB")


def _page_slop(data: bytearray) -> None:
    """The PT_LOAD holding the strings ends where they start: the kernel maps whole pages (and zeroes
    nothing when p_memsz is p_filesz), so the loader still reads them from the file."""
    strtab = _strtab(data)
    at, f = next((at, f) for at, f in _headers(data) if f[0] == _PT_LOAD and f[3] <= strtab < f[3] + f[5])
    f[5] = f[6] = strtab - f[3]
    struct.pack_into(_PHDR, data, at, *f)


def _dynamic_offset(data: bytearray) -> None:
    """PT_DYNAMIC's p_offset names 8 zero bytes (e_ident's padding: DT_NULL) while its p_vaddr, which is
    what the loader reads, still names the real table."""
    at, f = next((at, f) for at, f in _headers(data) if f[0] == _PT_DYNAMIC)
    f[2] = 8
    struct.pack_into(_PHDR, data, at, *f)


def _second_dynamic(data: bytearray) -> None:
    """Two PT_DYNAMIC headers: the first (which the reader took) names e_ident's zeros, a later one (a
    PT_NOTE's slot, which the loader takes: the last wins) the real table."""
    headers = _headers(data)
    first, real = next((at, f) for at, f in headers if f[0] == _PT_DYNAMIC)
    note = next(at for at, f in headers if f[0] == _PT_NOTE and at > first)
    struct.pack_into(_PHDR, data, note, *real)
    struct.pack_into(_PHDR, data, first, _PT_DYNAMIC, 4, 8, 8, 8, 16, 16, 8)


def _as_linked(data: bytearray) -> None:
    """No change: the RUNPATH is what the reader misses (`/usr/lib:` 454 times, `/usr/lib/.:$ORIGIN/../lib`:
    past the 4096 bytes it read of each string, which it cut there without an end)."""


_ORIGIN, _LONG = (
    "$ORIGIN/../lib",
    "/usr/lib:" * 454 + "/usr/lib/.:$ORIGIN/../lib",
)  # cut at 4096: `/usr/lib/.`


def _loads_then_refused(demo: Demo, program: Path, marker: Path, *args: str) -> str:
    """`program` (root's), run, loads nobody's library (its constructor records uid 0 in `marker`); as
    `[venv] python` it is refused, named, and nothing of nobody's runs. apply's output."""
    subprocess.run([program, *args], check=False, capture_output=True)
    assert marker.read_text() == "uid=0\n"  # the loader loads it
    marker.unlink()
    output = applied_with_python(demo, program, marker)
    assert f"[venv].python {program}" in output, output
    return output


def _nobodys_library(outside: Path) -> tuple[Path, Path]:
    """(nobody's directory, marker): in it `libz9.so`, nobody's, whose constructor records who loaded
    it in `marker` (an audit library too: it answers la_version)."""
    theirs, marker = nobodys_dir(outside, "theirs"), outside / "ran-as"
    source = _THEIRS % marker + "unsigned la_version(unsigned v) { return v; }\n"
    _gcc(theirs / "libz9.so", source, "-shared", "-fPIC")
    os.chown(theirs / "libz9.so", NOBODY, NOGROUP)
    return theirs, marker


def _program(outside: Path, *flags: str) -> Path:
    """A program of root's at <outside>/python/bin/python3 that does nothing, linked with `flags`."""
    program = outside / "python" / "bin" / "python3"
    program.parent.mkdir(parents=True)
    _gcc(program, "int main(void) { return 0; }\n", *flags)
    return program


def _library(path: Path, *flags: str) -> None:
    """An empty shared library of root's at `path`, linked with `flags`."""
    _gcc(path, f"int {path.name.split('.')[0]}(void) {{ return 0; }}\n", "-shared", "-fPIC", *flags)


def _runpath(libs: Path, *names: str) -> list[str]:
    """Link flags: need each of `names` (libNAME.so), found through the RUNPATH `libs`."""
    return [
        "-Wl,--no-as-needed",
        f"-L{libs}",
        *(f"-l{n}" for n in names),
        f"-Wl,-rpath,{libs},--enable-new-dtags",
    ]


@pytest.mark.parametrize(
    ("runpath", "patch"),
    [(_ORIGIN, _page_slop), (_ORIGIN, _dynamic_offset), (_ORIGIN, _second_dynamic), (_LONG, _as_linked)],
    ids=["page-slop", "dynamic-offset", "second-dynamic", "long-runpath"],
)
def test_a_libpython_of_nobodys_behind_headers_the_reader_reads_otherwise_never_loads(
    demo: Demo, outside: Path, runpath: str, patch: Callable[[bytearray], None]
) -> None:
    """Round 18's shared build (root's program, RUNPATH `$ORIGIN/../lib`, `<prefix>/lib/libpython3.X.so`
    nobody's), its headers patched so that elf.py finds no dynamic table or no strings while the kernel
    and ld.so still do: the strings just past the end of their PT_LOAD's p_filesz (in its last page),
    PT_DYNAMIC's p_offset apart from its p_vaddr, or two PT_DYNAMIC headers; or, unpatched, a RUNPATH
    longer than 4096 bytes. main: elf.loads read "no libraries, no RUNPATH" (or one cut entry), the exec
    role passed the program, and apply's `python -I -S -m venv` loaded nobody's library (its constructor
    ran as uid 0)."""
    base = outside / "python"
    program = _shared_python(base, runpath)
    marker = outside / "ran-as"
    _theirs(base / "lib" / sysconfig.get_config_var("INSTSONAME"), marker)
    data = bytearray(program.read_bytes())
    patch(data)
    program.write_bytes(data)
    output = _loads_then_refused(demo, program, marker, "-c", "pass")
    refusal = "owned by nobody" if patch in (_dynamic_offset, _as_linked) else "cannot read what the kernel"
    assert refusal in output, output


def test_a_library_of_nobodys_past_the_readers_count_of_libraries_never_loads(
    demo: Demo, outside: Path
) -> None:
    """The reader followed what each library loads in turn only for its first 8 libraries (the program
    counted), then skipped the rest unread; the loader loads them all. A program of root's that needs 8
    empty libraries of root's and then a ninth (all in a directory of root's, its RUNPATH) whose own
    RUNPATH is a directory of nobody's, where the library it needs is. main: the exec role passed it,
    and apply's `python -I -S -m venv` loaded nobody's library as uid 0."""
    theirs, marker = _nobodys_library(outside)
    libs = outside / "libs"
    libs.mkdir()
    for i in range(8):
        _library(libs / f"libr{i}.so")
    _library(libs / "libr8.so", *_runpath(theirs, "z9"))
    _loads_then_refused(demo, _program(outside, *_runpath(libs, *(f"r{i}" for i in range(9)))), marker)


def test_a_library_of_nobodys_behind_a_hardware_capability_copy_never_loads(
    demo: Demo, outside: Path
) -> None:
    """The reader followed each needed library at `<dir>/<name>` only, but the loader first tries the
    hardware-capability subdirectories of a RUNPATH directory (`glibc-hwcaps/x86-64-v2/`, `haswell/`,
    `tls/`...): a program of root's whose RUNPATH directory (root's) holds `libr.so` and a copy at
    `glibc-hwcaps/x86-64-v2/libr.so` (root's too, so the directory's whole-subtree check passes) whose
    own RUNPATH is nobody's directory, where the library it needs is. main: the exec role passed it,
    and apply's `python -I -S -m venv` loaded nobody's library as uid 0."""
    theirs, marker = _nobodys_library(outside)
    libs = outside / "libs"
    (libs / "glibc-hwcaps" / "x86-64-v2").mkdir(parents=True)
    _library(libs / "libr.so")
    _library(libs / "glibc-hwcaps" / "x86-64-v2" / "libr.so", *_runpath(theirs, "z9"))
    _loads_then_refused(demo, _program(outside, *_runpath(libs, "r")), marker)


@pytest.mark.parametrize("tag", ["DT_AUDIT", "DT_AUXILIARY"])
def test_an_audit_or_filter_library_of_nobodys_a_program_names_never_loads(
    demo: Demo, outside: Path, tag: str
) -> None:
    """The reader followed DT_NEEDED only; the loader also opens, for a program, the audit libraries its
    DT_AUDIT names (`ld --audit`: run before anything else, as root runs it) and, for a library, the
    objects its DT_AUXILIARY or DT_FILTER names (`ld -f`/`-F`). A program of root's whose DT_AUDIT is a
    library in nobody's directory, or that needs a library of root's (in its RUNPATH directory, root's)
    whose DT_AUXILIARY is. main: the exec role passed it, and apply's `python -I -S -m venv` loaded
    nobody's library as uid 0."""
    theirs, marker = _nobodys_library(outside)
    if tag == "DT_AUDIT":
        program = _program(outside, f"-Wl,--audit={theirs / 'libz9.so'}")
    else:
        libs = outside / "libs"
        libs.mkdir()
        _library(libs / "libr.so", f"-Wl,-f,{theirs / 'libz9.so'}")
        program = _program(outside, *_runpath(libs, "r"))
    _loads_then_refused(demo, program, marker)


# --- a copied venv's pyvenv.cfg `home`, read otherwise than getpath reads it ------------------------------


@pytest.mark.parametrize("form", ["linked-bin", "upper-key"])
def test_a_module_of_nobodys_where_getpath_reads_a_copied_venvs_home_never_runs_when_root_makes_the_venv(
    demo: Demo, outside: Path, form: str
) -> None:
    """Round 18 judged the library from `filesafety.pyvenv_home`: the real path of a `home` key. getpath
    reads the key in any case and walks up from `home` as written, links unresolved. A venv's python
    made with `--copies` (root's, its pyvenv.cfg root's), and (round 17's) a standalone install whose
    `venv/__init__.py` is nobody's: `home = <front>/bin`, where `<front>` (root's) holds `bin`, a link to
    this machine's python directory (root's), and `lib`, a link to the standalone's `lib`; or `HOME =
    <standalone>/bin`. main: library_problem judged the real `bin`'s library (or none), and apply's
    `python -I -S -m venv` ran nobody's line as uid 0."""
    python, copied, marker, init = copied_venv(outside)
    line = f"HOME = {python.parent}"
    if form == "linked-bin":
        front = outside / "front"
        front.mkdir()
        (front / "bin").symlink_to(os.path.dirname(os.path.realpath(sys._base_executable)))  # type: ignore[attr-defined]
        (front / "lib").symlink_to(python.parent.parent / "lib")
        line = f"home = {front / 'bin'}"
    cfg = copied / "pyvenv.cfg"
    cfg.write_text(
        "".join(f"{line}\n" if x.startswith("home") else x for x in cfg.read_text().splitlines(True))
    )
    output = applied_with_python(demo, copied / "bin" / "python3", marker)
    assert f"{init} is owned by nobody" in output, output
