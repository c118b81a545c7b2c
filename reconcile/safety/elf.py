"""What the kernel and the dynamic loader read for an ELF program before its first instruction: its
program interpreter (PT_INTERP), the libraries it names (DT_NEEDED) and the directories it asks the loader
to search first (DT_RPATH, DT_RUNPATH). Read from the file's bytes, never by running a loader on it (ldd
runs a program whose interpreter is not the system's). Both classes, both byte orders; a file that is
not ELF reads as naming nothing.

Read as they read it (nineteenth round): the kernel reads PT_INTERP from the file; the loader reads the
dynamic table and its strings from memory, at PT_DYNAMIC's and DT_STRTAB's addresses, where the PT_LOADs
map the file. An ELF file whose reading is not one answer (several PT_DYNAMIC or DT_STRTAB, an address
outside the file bytes of exactly one PT_LOAD or in another's pages, a string with no end there, headers
that do not read) is `unreadable`: what it loads is not known, and the exec role refuses it."""

from __future__ import annotations

import os
import struct

from reconcile.record import Record

_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29
# What else the loader opens by name (nineteenth round): a program's audit libraries (DT_AUDIT, and
# DT_DEPAUDIT: `:`-separated lists) and a library's filtees (DT_AUXILIARY, DT_FILTER)
_DT_AUDITS, _DT_FILTERS = (0x6FFFFEFC, 0x6FFFFEFB), (0x7FFFFFFD, 0x7FFFFFFF)
_DT_OPENS = (_DT_NEEDED, *_DT_FILTERS)
_PHNUM_MAX = 4096  # the kernel refuses more than 64 KiB of program headers
_DYNAMIC_MAX = 1 << 20
_STRING_MAX = 1 << 16  # a longer name or search list is refused, not cut
_INTERP_MAX = 4096  # the kernel's PATH_MAX for PT_INTERP


class Loads(Record):
    interpreter: str | None  # PT_INTERP: the loader the kernel maps (/lib64/ld-linux-x86-64.so.2)
    needed: list[str]  # DT_NEEDED (and the audit and filter objects): a name with `/` is opened as that path
    search: list[str]  # DT_RPATH and DT_RUNPATH entries, as written ($ORIGIN unexpanded)
    rpath: list[str]  # DT_RPATH's: the loader searches them for the objects loaded under this one too
    unreadable: str | None = None  # why the headers do not read as one answer (see the module's doc)


class _Segment(Record):
    kind: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


def _read(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset) if size > 0 and offset >= 0 else b""
    if len(data) != size:
        raise ValueError(f"{size} bytes at file offset {offset:#x} are past its end")
    return data


def _file_offset(segments: list[_Segment], address: int, size: int) -> tuple[int, int]:
    """(file offset, bytes of the file mapped from there on) for `size` bytes the loader reads at
    `address`: they must lie in the file bytes of one PT_LOAD, and in no other PT_LOAD's pages (a later
    mapping replaces an earlier one's, and a page holds file bytes past p_filesz)."""
    page = os.sysconf("SC_PAGESIZE")
    loads = [s for s in segments if s.kind == _PT_LOAD]
    holding = [s for s in loads if s.vaddr <= address and address + size <= s.vaddr + s.filesz]
    pages = [(s.vaddr // page * page, -(-(s.vaddr + s.memsz) // page) * page) for s in loads]
    touching = [start for start, end in pages if start < address + size and address < end]
    if len(holding) != 1 or len(touching) != 1:
        raise ValueError(f"address {address:#x} is not in the file bytes of exactly one PT_LOAD")
    return holding[0].offset + address - holding[0].vaddr, holding[0].vaddr + holding[0].filesz - address


def _string(fd: int, segments: list[_Segment], address: int) -> str:
    offset, room = _file_offset(segments, address, 1)
    data = _read(fd, min(room, _STRING_MAX), offset)
    if b"\0" not in data:
        raise ValueError(f"the string at {address:#x} does not end inside its PT_LOAD (or within 64 KiB)")
    return os.fsdecode(data.split(b"\0", 1)[0])


def loads(fd: int) -> Loads:
    """What the ELF file open at `fd` has the kernel and the loader read (see the module's doc)."""
    ident = os.pread(fd, 16, 0)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        return Loads(None, [], [], [])
    try:
        return _loads(fd, ident)
    except (ValueError, struct.error, OSError) as e:
        return Loads(None, [], [], [], str(e) or type(e).__name__)


def _loads(fd: int, ident: bytes) -> Loads:
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ValueError("its ELF class or byte order is not one of ELF's")
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    # e_phoff, e_phentsize, e_phnum; a program header; a dynamic entry
    header, at, phdr, dyn = ("Q14xHH", 0x20, "IIQQQQQQ", "qQ") if wide else ("I10xHH", 0x1C, "IIIIIIII", "iI")
    header, phdr, dyn = order + header, order + phdr, order + dyn
    phoff, phentsize, phnum = struct.unpack(header, _read(fd, struct.calcsize(header), at))
    if phnum > _PHNUM_MAX or phentsize != struct.calcsize(phdr):
        raise ValueError(f"its program headers ({phnum} of {phentsize} bytes) are not what the kernel reads")
    segments = []
    for i in range(phnum):
        fields = struct.unpack(phdr, _read(fd, phentsize, phoff + i * phentsize))
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = fields
        else:
            p_type, p_offset, p_vaddr, _, p_filesz, p_memsz, _, _ = fields
        segments.append(_Segment(p_type, p_offset, p_vaddr, p_filesz, p_memsz))
    # the kernel maps the first PT_INTERP: p_filesz bytes of the file, their last a NUL
    first = next((s for s in segments if s.kind == _PT_INTERP), None)
    interp = None
    if first is not None:
        data = _read(fd, first.filesz, first.offset) if first.filesz <= _INTERP_MAX else b""
        if not data.endswith(b"\0"):
            raise ValueError("its PT_INTERP is not a path the kernel reads")
        interp = os.fsdecode(data.split(b"\0", 1)[0])
    dynamics = [s for s in segments if s.kind == _PT_DYNAMIC]
    if not dynamics:
        return Loads(interp, [], [], [])
    if len(dynamics) > 1:
        raise ValueError("it has several PT_DYNAMIC headers")
    step = struct.calcsize(dyn)
    size = min(dynamics[0].filesz, _DYNAMIC_MAX) // step * step
    offset, _ = _file_offset(segments, dynamics[0].vaddr, size)
    entries = []
    for tag, value in struct.iter_unpack(dyn, _read(fd, size, offset)):
        if tag == 0:
            break
        entries.append((tag, value))
    else:
        raise ValueError("its dynamic table has no end (DT_NULL)")
    strtabs = {v for t, v in entries if t == _DT_STRTAB}
    named = [(t, v) for t, v in entries if t in (*_DT_OPENS, *_DT_AUDITS, _DT_RPATH, _DT_RUNPATH)]
    if len(strtabs) > 1 or (named and not strtabs):
        raise ValueError(f"it has {len(strtabs)} DT_STRTAB entries")
    strings = [(t, _string(fd, segments, min(strtabs) + v)) for t, v in named]
    needed = [s for t, s in strings if t in _DT_OPENS]
    needed += [n for t, s in strings if t in _DT_AUDITS for n in s.split(":") if n]
    search = [d for t, s in strings if t in (_DT_RPATH, _DT_RUNPATH) for d in s.split(":")]
    return Loads(interp, needed, search, [d for t, s in strings if t == _DT_RPATH for d in s.split(":")])
