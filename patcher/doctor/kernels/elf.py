"""Just enough ELF to find the sections that hold GPU code, read through a memory map.

A kernel library is hundreds of megabytes (sgl-kernel's `common_ops` is ~370 MB); only the
ELF header, the section table and the section-name table are read here, so the cost is a few
pages whatever the size. Layout: the System V gABI, "ELF-64 Object File Format" (64-bit,
little-endian only: every CUDA host library on x86-64 and aarch64 Linux, and every cubin).
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_CUDA = 190  # e_machine of a cubin (gABI machine list; LLVM's ELF.h EM_CUDA)
SHT_NOBITS = 8

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr, 64 bytes
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr, 64 bytes
# A real library has a few dozen sections; a table claiming more is damage, not a library.
_MAX_SECTIONS = 65_535


class BadBinary(ValueError):
    """The file is not a readable 64-bit little-endian ELF (the reason is the message)."""


class Section(NamedTuple):
    name: str
    type: int
    offset: int
    size: int


class ElfImage(NamedTuple):
    """What the inspector needs from one ELF file: its header fields and its sections."""

    machine: int
    osabi: int  # e_ident[EI_OSABI]: 0x33 for CUDA 12 ABI cubins, 0x41 for the CUDA 13 ABI
    abi_version: int  # e_ident[EI_ABIVERSION]: 7 (legacy cubin layout) or 8 (sm_100-era layout)
    flags: int  # e_flags
    sections: tuple[Section, ...]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


@contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """The file's bytes, memory-mapped read-only; a file that is not regular is refused first.

    Opening with O_NONBLOCK and checking the type on the open descriptor keeps a FIFO planted
    where a `.so` should be from hanging the reader.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BadBinary(f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadBinary("not a regular file")
        if st.st_size == 0:
            yield memoryview(b"")
            return
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise BadBinary(f"cannot map: {exc}") from None
        view = memoryview(mm)
        try:
            yield view
        finally:
            # Slices of the view may outlive it in an exception's frames; then the map is
            # closed when they are collected instead of now.
            try:
                view.release()
                mm.close()
            except BufferError:
                pass
    finally:
        os.close(fd)


def parse(data: memoryview | bytes) -> ElfImage:
    """The header and section table of an ELF image held in `data`; BadBinary if damaged."""
    if len(data) < _EHDR.size:
        raise BadBinary(f"truncated ELF: {len(data)} bytes, the header alone is {_EHDR.size}")
    ident, _type, machine, _ver, _entry, _phoff, shoff, flags, _ehsize, _phes, _phnum = (
        _EHDR.unpack_from(data, 0)[:11]
    )
    shentsize, shnum, shstrndx = _EHDR.unpack_from(data, 0)[11:]
    if ident[:4] != ELF_MAGIC:
        raise BadBinary("not an ELF file")
    if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
        raise BadBinary("not a 64-bit little-endian ELF file")
    if shoff == 0 or shnum == 0:
        return ElfImage(machine, ident[7], ident[8], flags, ())
    if shentsize != _SHDR.size or shnum > _MAX_SECTIONS:
        raise BadBinary(f"damaged section table ({shnum} entries of {shentsize} bytes)")
    if shoff + shnum * _SHDR.size > len(data):
        raise BadBinary(
            f"truncated ELF: the section table ends at byte {shoff + shnum * _SHDR.size}, "
            f"the file has {len(data)}"
        )
    raw = [_SHDR.unpack_from(data, shoff + i * _SHDR.size) for i in range(shnum)]
    if shstrndx >= shnum:
        raise BadBinary("damaged section table (no section-name table)")
    names_at, names_size = raw[shstrndx][4], raw[shstrndx][5]
    if names_at + names_size > len(data):
        raise BadBinary("truncated ELF: the section-name table lies past the end of the file")
    names = bytes(data[names_at : names_at + names_size])
    sections = []
    for name_off, sh_type, _fl, _addr, offset, size, *_ in raw:
        end = names.find(b"\0", name_off)
        name = names[name_off : end if end >= 0 else None].decode("latin-1")
        sections.append(Section(name, sh_type, offset, size))
    return ElfImage(machine, ident[7], ident[8], flags, tuple(sections))


def section_bytes(data: memoryview, section: Section) -> memoryview:
    """A section's contents (a view, nothing copied); BadBinary when it runs past the file."""
    if section.type == SHT_NOBITS:
        return data[0:0]
    if section.offset + section.size > len(data):
        raise BadBinary(
            f"truncated ELF: section {section.name} ends at byte {section.offset + section.size}, "
            f"the file has {len(data)}"
        )
    return data[section.offset : section.offset + section.size]
