"""What the kernel and the dynamic loader read for an ELF program before its first instruction: its
program interpreter (PT_INTERP), the libraries it names (DT_NEEDED) and the directories it asks the loader
to search first (DT_RPATH, DT_RUNPATH). Read from the file's bytes, never by running a loader on it (ldd
runs a program whose interpreter is not the system's). Both classes, both byte orders; a file that is
not ELF, or whose headers do not hold together, reads as naming nothing (the kernel refuses to run it)."""

from __future__ import annotations

import os
import struct

from reconcile.record import Record

_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29
_PHNUM_MAX = 4096  # the kernel refuses more than 64 KiB of program headers
_DYNAMIC_MAX = 1 << 20
_STRING_MAX = 4096  # PATH_MAX: a longer name or search list is nothing the loader can open


class Loads(Record):
    interpreter: str | None  # PT_INTERP: the loader the kernel maps (/lib64/ld-linux-x86-64.so.2)
    needed: list[str]  # DT_NEEDED: a name with `/` is opened as that path
    search: list[str]  # DT_RPATH and DT_RUNPATH entries, as written ($ORIGIN unexpanded)


def _read(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset) if size > 0 and offset >= 0 else b""
    if len(data) != size:
        raise ValueError("truncated")
    return data


def _string(fd: int, offset: int) -> str:
    data = os.pread(fd, _STRING_MAX, offset) if offset >= 0 else b""
    return os.fsdecode(data.split(b"\0", 1)[0])


def loads(fd: int) -> Loads:
    """What the ELF file open at `fd` has the kernel and the loader read (see the module's doc)."""
    try:
        return _loads(fd)
    except (ValueError, struct.error, OSError):
        return Loads(None, [], [])


def _loads(fd: int) -> Loads:
    ident = os.pread(fd, 16, 0)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return Loads(None, [], [])
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    # e_phoff, e_phentsize, e_phnum; a program header; a dynamic entry
    header, at, phdr, dyn = ("Q14xHH", 0x20, "IIQQQQQQ", "qQ") if wide else ("I10xHH", 0x1C, "IIIIIIII", "iI")
    header, phdr, dyn = order + header, order + phdr, order + dyn
    phoff, phentsize, phnum = struct.unpack(header, _read(fd, struct.calcsize(header), at))
    if phnum > _PHNUM_MAX or phentsize < struct.calcsize(phdr):
        return Loads(None, [], [])
    segments = []  # (type, offset, vaddr, filesz)
    for i in range(phnum):
        fields = struct.unpack(phdr, _read(fd, struct.calcsize(phdr), phoff + i * phentsize))
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = fields
        else:
            p_type, p_offset, p_vaddr, _, p_filesz, _, _, _ = fields
        segments.append((p_type, p_offset, p_vaddr, p_filesz))
    interp = next((_string(fd, off) for kind, off, _, _ in segments if kind == _PT_INTERP), None)
    dynamic = next(((off, size) for kind, off, _, size in segments if kind == _PT_DYNAMIC), None)
    if dynamic is None:
        return Loads(interp, [], [])
    entries, step = [], struct.calcsize(dyn)
    table = _read(fd, min(dynamic[1], _DYNAMIC_MAX) // step * step, dynamic[0])
    for tag, value in struct.iter_unpack(dyn, table):
        if tag == 0:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    base = next(
        (off + strtab - vaddr for kind, off, vaddr, size in segments
         if kind == _PT_LOAD and strtab is not None and vaddr <= strtab < vaddr + size),
        None,
    )  # fmt: skip
    if base is None:
        return Loads(interp, [], [])
    needed = [_string(fd, base + v) for t, v in entries if t == _DT_NEEDED]
    paths = [_string(fd, base + v) for t, v in entries if t in (_DT_RPATH, _DT_RUNPATH)]
    search = [d for p in paths for d in p.split(":")]
    return Loads(interp, needed, search)
