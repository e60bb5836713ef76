"""Just enough ELF to find the sections that hold GPU code, read by position (`os.pread`).

A kernel library is hundreds of megabytes (sgl-kernel's `common_ops` is ~370 MB); only the
ELF header, the section table, the section names and what the caller then asks of a section
are read, a page or so at a time, so the cost is a few pages whatever the size. What the
headers claim is capped too (how many sections, how long a name), so a damaged or hostile file
costs no more than a real one: past a cap the file is a `BadBinary`. Layout: the System V
gABI, "ELF-64 Object File Format" (64-bit, little-endian only: every CUDA host library on
x86-64 and aarch64 Linux, and every cubin).
"""

from __future__ import annotations

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
# The section table is read whole and every name in it, so its length bounds the cost. Measured:
# 30-41 sections in the host libraries of the sgl-kernel 0.3.21, torch 2.9.1 and triton wheels,
# at most 40 in flashinfer-cubin 0.6.3's 5,363 cubins (a cubin has a few per kernel). 4,096
# leaves a hundredfold margin and keeps the table to 256 KiB; more is damage.
_MAX_SECTIONS = 4096
# A name is read at most this far (in `_NAME_STEP` pieces) before it is damage. Host libraries'
# names are short (21 bytes at most, measured), but a cubin's carry mangled kernel names: 390 of
# flashinfer-cubin 0.6.3's are over 256 bytes (271 at most), and CUTLASS template names run to
# a few KiB. Without a bound, names pointing into a NUL-free table are each read to its end.
_MAX_NAME = 4096
_NAME_STEP = 256
# What one read fetches at least: later small reads next to it (the next entry header, the next
# section name) are served from it.
_BLOCK = 4096


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


class Span:
    """`size` bytes of an open file from byte `start`, read by position when asked.

    Nothing is read until asked for, and a read fetches at least a block, which the next small
    reads near it are served from; a section of hundreds of megabytes costs only what is looked
    at. Reads stop at the end of the span, as a slice does.
    """

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd = fd
        self.start = start
        self.size = size
        self._block_at = 0
        self._block = b""

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, length: int) -> bytes:
        """The bytes at `offset`..`offset + length`, fewer only where the span ends."""
        length = max(0, min(length, self.size - offset))
        if length == 0:
            return b""
        inside = offset - self._block_at
        if inside >= 0 and inside + length <= len(self._block):
            return self._block[inside : inside + length]
        wanted = min(max(length, _BLOCK), self.size - offset)
        block = _pread(self.fd, wanted, self.start + offset)
        if len(block) < length:
            raise BadBinary("truncated ELF: the file shrank while it was read")
        self._block_at, self._block = offset, block
        return block[:length]

    def span(self, offset: int, size: int) -> Span:
        """The `size` bytes at `offset` of this span, as a span of the same file."""
        return Span(self.fd, self.start + offset, size)


def _pread(fd: int, length: int, offset: int) -> bytes:
    """Up to `length` bytes at `offset`: all of them unless the file ends first."""
    parts = []
    try:
        while length > 0:
            part = os.pread(fd, length, offset)
            if not part:
                break
            parts.append(part)
            length -= len(part)
            offset += len(part)
    except OSError as exc:
        raise BadBinary(f"cannot read: {exc.strerror or exc}") from None
    return b"".join(parts)


@contextmanager
def opened(path: Path) -> Iterator[Span]:
    """The whole file as a span, for `parse`; a file that is not regular is refused first.

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
        yield Span(fd, 0, st.st_size)
    finally:
        os.close(fd)


def parse(data: Span) -> ElfImage:
    """The header and section table of the ELF image `data` holds; BadBinary if damaged."""
    header = data.read(0, _EHDR.size)
    if len(header) < _EHDR.size:
        raise BadBinary(f"truncated ELF: {len(data)} bytes, the header alone is {_EHDR.size}")
    ident, _type, machine, _ver, _entry, _phoff, shoff, flags, _ehsize, _phes, _phnum = (
        _EHDR.unpack(header)[:11]
    )
    shentsize, shnum, shstrndx = _EHDR.unpack(header)[11:]
    if ident[:4] != ELF_MAGIC:
        raise BadBinary("not an ELF file")
    if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
        raise BadBinary("not a 64-bit little-endian ELF file")
    if shoff == 0:
        return ElfImage(machine, ident[7], ident[8], flags, ())
    if shnum == 0:  # the gABI's extended numbering, for 65,280 sections or more
        raise BadBinary(f"damaged section table (more than {_MAX_SECTIONS} sections)")
    if shentsize != _SHDR.size or shnum > _MAX_SECTIONS:
        raise BadBinary(
            f"damaged section table ({shnum} entries of {shentsize} bytes; at most "
            f"{_MAX_SECTIONS} of {_SHDR.size} are read)"
        )
    if shoff + shnum * _SHDR.size > len(data):
        raise BadBinary(
            f"truncated ELF: the section table ends at byte {shoff + shnum * _SHDR.size}, "
            f"the file has {len(data)}"
        )
    table = data.read(shoff, shnum * _SHDR.size)
    raw = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
    if shstrndx >= shnum:
        raise BadBinary("damaged section table (no section-name table)")
    names_at, names_size = raw[shstrndx][4], raw[shstrndx][5]
    if names_at + names_size > len(data):
        raise BadBinary("truncated ELF: the section-name table lies past the end of the file")
    names = data.span(names_at, names_size)
    sections = [
        Section(_name(names, name_off), sh_type, offset, size)
        for name_off, sh_type, _fl, _addr, offset, size, *_ in raw
    ]
    return ElfImage(machine, ident[7], ident[8], flags, tuple(sections))


def _name(names: Span, offset: int) -> str:
    """The name at `offset` of the section-name table, to its NUL; BadBinary when it lies
    outside the table, has no NUL before the table ends, or is longer than `_MAX_NAME`."""
    if offset >= len(names):
        raise BadBinary(
            f"damaged section-name table: a name at byte {offset}, past its {len(names)} bytes"
        )
    parts, length = [], 0
    while length <= _MAX_NAME:
        chunk = names.read(offset + length, _NAME_STEP)
        if not chunk:
            raise BadBinary(f"damaged section-name table: the name at byte {offset} has no end")
        end = chunk.find(b"\0")
        parts.append(chunk[: end if end >= 0 else None])
        length += len(parts[-1])
        if end >= 0:
            break
    if length > _MAX_NAME:
        raise BadBinary(
            f"damaged section-name table: the name at byte {offset} is longer than "
            f"{_MAX_NAME} bytes"
        )
    return b"".join(parts).decode("latin-1")


def section_bytes(data: Span, section: Section) -> Span:
    """A section's contents (a span, nothing read yet); BadBinary when it runs past the file."""
    if section.type == SHT_NOBITS:
        return data.span(0, 0)
    if section.offset + section.size > len(data):
        raise BadBinary(
            f"truncated ELF: section {section.name} ends at byte {section.offset + section.size}, "
            f"the file has {len(data)}"
        )
    return data.span(section.offset, section.size)
