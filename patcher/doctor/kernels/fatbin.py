"""The device code inside a host library (CUDA fat binaries) or a standalone cubin.

Fat binary layout (no NVIDIA document describes it; these are the fields this reader needs,
checked by hand against `cuobjdump --list-elf/--list-ptx` on nvcc 12.9 and 13.0 output and on
the sgl-kernel, torch and Triton wheels SGLang 0.5.9 pins; see docs/kernels-readme-draft.md):

- sections `.nv_fatbin` (linked code) and `__nv_relfatbin` (relocatable, `-rdc`), names from
  CUDA's `include/fatbinary_section.h`; like cuobjdump, the first is read and the second only
  when the first is absent;
- a section holds one or more containers: magic 0xBA55ED50, u16 version, u16 header size,
  u64 size of the entries that follow;
- each entry: u16 kind (1 = PTX, 2 = ELF/SASS), u16 version, u32 header size, u64 payload
  size, ..., u32 SM arch at byte 28, u64 flags at byte 40. Flags measured: 0x1 64-bit,
  0x10 Linux, 0x2000 compressed (LZ4, older nvcc) and 0x8000 compressed (zstd, CUDA 12.8+),
  0x100000 arch-specific (`sm_120a`), 0x200000 family-specific (`sm_120f`).
  The arch lives in the header, so compressed payloads never need unpacking.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

from sglpatch.doctor.kernels import elf
from sglpatch.doctor.kernels.archs import Code

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

KIND_PTX = 1
KIND_ELF = 2
FLAG_COMPRESSED_LZ4 = 0x2000
FLAG_COMPRESSED_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIIIIIQ")  # the first 48 bytes of an entry header
_ENTRY_MIN = 64
# Containers follow each other, sometimes padded; past this much padding we search for the magic.
_SEARCH_CHUNK = 1 << 20

# CUDA ELF e_flags (LLVM's llvm/BinaryFormat/ELF.h, EF_CUDA_*), checked on ptxas output:
# ABI version 7 (ptxas 12.x for sm_90 and older): SM in bits 0..7, `a` = 0x800;
# ABI version 8 (ptxas 12.x for sm_100+, every ptxas 13): SM in bits 8..15, `a` = 0x8.
# ptxas 13.0 no longer sets 0x8; it records `a` as attribute 9 = 1 of section `.nv.compat`.
_EF_ACCEL_V1 = 0x800
_EF_ACCEL_V2 = 0x8
_COMPAT_ARCH_SPECIFIC = 9
_RECORD = struct.Struct("<BBH")  # one record of `.nv.compat`: format, attribute, value


def codes_in_library(path: Path) -> tuple[Counter[Code], int, str]:
    """The device code in a host library: (entries per code, compressed entries, section read).

    The section is "" when the library holds no fat binary (CPU code only).
    Raises elf.BadBinary for a damaged file.
    """
    with elf.opened(path) as data:
        image = elf.parse(data)
        for name in FATBIN_SECTIONS:
            section = image.section(name)
            if section is not None:
                codes, compressed = read_fatbin(elf.section_bytes(data, section))
                return codes, compressed, name
        return Counter(), 0, ""


def read_fatbin(view: elf.Span) -> tuple[Counter[Code], int]:
    """Every code target in the fat binary containers of one section, and how many entries
    are compressed. Only the headers are read, never a payload. Raises elf.BadBinary when a
    size points past the section."""
    codes: Counter[Code] = Counter()
    compressed = 0
    pos = _next_container(view, 0)
    while pos is not None:
        _magic, _version, header_size, fat_size = _CONTAINER.unpack(view.read(pos, _CONTAINER.size))
        end = pos + header_size + fat_size
        if header_size < _CONTAINER.size or end > len(view):
            raise elf.BadBinary(
                f"damaged fat binary at section offset {pos}: it claims {fat_size} bytes, "
                f"{len(view) - pos - header_size} remain"
            )
        entry = pos + header_size
        while entry + _ENTRY_MIN <= end:
            kind, _v, entry_size, payload, *_, arch, _n_off, _n_len, flags = _ENTRY.unpack(
                view.read(entry, _ENTRY.size)
            )
            if entry_size < _ENTRY_MIN or entry + entry_size + payload > end:
                raise elf.BadBinary(f"damaged fat binary entry at section offset {entry}")
            if kind in (KIND_PTX, KIND_ELF):
                codes[_code(kind, arch, flags)] += 1
                compressed += bool(flags & (FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_ZSTD))
            entry += entry_size + payload
        pos = _next_container(view, end)
    return codes, compressed


def _code(kind: int, arch: int, flags: int) -> Code:
    variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
    return Code("ptx" if kind == KIND_PTX else "sass", arch, variant)


def _next_container(view: elf.Span, start: int) -> int | None:
    magic = struct.pack("<I", FATBIN_MAGIC)
    probe = start
    while probe + _CONTAINER.size <= len(view):
        if view.read(probe, 4) == magic:
            return probe
        if probe - start >= 64:  # not plain padding: search the rest in chunks
            chunk = view.read(probe, _SEARCH_CHUNK + 3)
            found = chunk.find(magic)
            if found < 0:
                if probe + _SEARCH_CHUNK >= len(view):
                    return None
                probe += _SEARCH_CHUNK
                continue
            probe += found
            continue
        probe += 4
    return None


def cubin_code(path: Path) -> Code:
    """The architecture of a standalone cubin (an ELF with e_machine EM_CUDA)."""
    with elf.opened(path) as data:
        image = elf.parse(data)
        if image.machine != elf.EM_CUDA:
            raise elf.BadBinary(f"not a cubin (e_machine {image.machine})")
        if image.abi_version >= 8:
            sm, accel = (image.flags >> 8) & 0xFF, bool(image.flags & _EF_ACCEL_V2)
        else:
            sm, accel = image.flags & 0xFF, bool(image.flags & _EF_ACCEL_V1)
        compat = image.section(".nv.compat")
        if not accel and compat is not None:
            accel = _compat_attr(elf.section_bytes(data, compat), _COMPAT_ARCH_SPECIFIC) == 1
        variant = "a" if accel else ""
        tkinfo = image.section(".note.nv.tkinfo")
        if not accel and tkinfo is not None and tkinfo.size < 4096:
            # `f` changes nothing in the cubin itself (nvcc manual: sm_100f and sm_100 SASS
            # are the same); ptxas's recorded command line is the only trace of it.
            text = elf.section_bytes(data, tkinfo).read(0, tkinfo.size)
            if f"sm_{sm}f".encode() in text:
                variant = "f"
        return Code("sass", sm, variant)


def _compat_attr(data: elf.Span, wanted: int) -> int | None:
    """One attribute of `.nv.compat`: 4-byte records (format, attribute, value), format 4
    carrying a u16 length and that many bytes (the EIFMT_* layout of `.nv.info`)."""
    pos = 0
    while pos + 4 <= len(data):
        record: tuple[int, int, int] = _RECORD.unpack(data.read(pos, _RECORD.size))
        fmt, attr, value = record
        if fmt == 4:
            pos += 4 + value
            continue
        if attr == wanted:
            return value & 0xFF if fmt == 2 else value
        pos += 4
    return None
