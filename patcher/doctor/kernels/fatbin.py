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
_MAGIC = struct.pack("<I", FATBIN_MAGIC)
_ENTRY = struct.Struct("<HHIQIIIIIIQ")  # the first 48 bytes of an entry header
_ENTRY_MIN = 64
# The walk steps from header to header by their declared sizes, so headers, not bytes, are its
# cost. Measured, the most in one section: 397 containers and 2,787 entries (torch 2.9.1's
# libtorch_cuda.so); sgl-kernel 0.3.21's libraries 74 + 444 and 182 + 546. A tenfold margin
# over torch; a section claiming more is damage (each header may cost one read of a page).
_MAX_HEADERS = 1 << 15
# Containers follow each other back to back in every library measured; a linker may pad one to
# its section's alignment (8 for `.nv_fatbin`). Zeros up to a page are taken as such padding;
# more zeros, or other bytes, where a container should start are damage and the walk stops.
_MAX_PADDING = 4096

# CUDA ELF e_flags (LLVM's llvm/BinaryFormat/ELF.h, EF_CUDA_*), checked on ptxas output:
# ABI version 7 (ptxas 12.x for sm_90 and older): SM in bits 0..7, `a` = 0x800;
# ABI version 8 (ptxas 12.x for sm_100+, every ptxas 13): SM in bits 8..15, `a` = 0x8.
# ptxas 13.0 no longer sets 0x8; it records `a` as attribute 9 = 1 of section `.nv.compat`.
_EF_ACCEL_V1 = 0x800
_EF_ACCEL_V2 = 0x8
_COMPAT_ARCH_SPECIFIC = 9
_RECORD = struct.Struct("<BBH")  # one record of `.nv.compat`: format, attribute, value
# `.nv.compat` is walked four bytes at a time, so it is read only when small: 16 bytes at most
# in flashinfer-cubin 0.6.3's 5,363 cubins (measured); a larger one is damage.
_MAX_COMPAT = 4096


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
    are compressed. Only the headers are read, never a payload, and at most `_MAX_HEADERS`.
    Raises elf.BadBinary when a size points past the section, when something other than a
    container (or a little padding) is where one should start, and when the section holds no
    SASS or PTX entry at all: a section of zeros or of empty containers is damage, never a
    library without code for the GPU."""
    codes: Counter[Code] = Counter()
    compressed = containers = headers = 0
    pos = _next_container(view, 0)
    while pos is not None:
        _magic, _version, header_size, fat_size = _CONTAINER.unpack(view.read(pos, _CONTAINER.size))
        end = pos + header_size + fat_size
        if header_size < _CONTAINER.size or end > len(view):
            raise elf.BadBinary(
                f"damaged fat binary at section offset {pos}: it claims {fat_size} bytes, "
                f"{len(view) - pos - header_size} remain"
            )
        containers += 1
        headers += 1
        entry = pos + header_size
        while entry + _ENTRY_MIN <= end:
            headers += 1
            if headers > _MAX_HEADERS:
                break
            kind, _v, entry_size, payload, *_, arch, _n_off, _n_len, flags = _ENTRY.unpack(
                view.read(entry, _ENTRY.size)
            )
            if entry_size < _ENTRY_MIN or entry + entry_size + payload > end:
                raise elf.BadBinary(f"damaged fat binary entry at section offset {entry}")
            if kind in (KIND_PTX, KIND_ELF):
                codes[_code(kind, arch, flags)] += 1
                compressed += bool(flags & (FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_ZSTD))
            entry += entry_size + payload
        if headers > _MAX_HEADERS:
            raise elf.BadBinary(
                f"damaged fat binary: more than {_MAX_HEADERS} container and entry headers "
                f"(read up to section offset {pos})"
            )
        pos = _next_container(view, end)
    if not containers:
        raise elf.BadBinary("damaged fat binary: the section holds no container")
    if not codes:
        raise elf.BadBinary(
            f"damaged fat binary: {containers} container{'s' * (containers > 1)} and no SASS "
            "or PTX entry in them"
        )
    return codes, compressed


def _code(kind: int, arch: int, flags: int) -> Code:
    variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
    return Code("ptx" if kind == KIND_PTX else "sass", arch, variant)


def _next_container(view: elf.Span, start: int) -> int | None:
    """Where the container after byte `start` begins: there, or past up to `_MAX_PADDING`
    zero bytes; None where only such padding is left. Anything else there is damage: the
    section is not searched, so a sparse gigabyte of zeros costs one read, not a gigabyte."""
    if start >= len(view):
        return None
    if view.read(start, 4) == _MAGIC:
        pos = start
    else:
        window = view.read(start, _MAX_PADDING + 4)
        padding = len(window) - len(window.lstrip(b"\0"))
        pos = start + padding
        if padding > _MAX_PADDING:
            raise elf.BadBinary(
                f"damaged fat binary: zeros from section offset {start} past {_MAX_PADDING} "
                "bytes, where a container should start"
            )
        if pos >= len(view):
            return None
        if window[padding : padding + 4] != _MAGIC:
            raise elf.BadBinary(f"damaged fat binary: no container at section offset {pos}")
    if pos + _CONTAINER.size > len(view):
        raise elf.BadBinary(f"truncated fat binary at section offset {pos}")
    return pos


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
            if compat.size > _MAX_COMPAT:
                raise elf.BadBinary(
                    f"damaged cubin: .nv.compat claims {compat.size} bytes, at most "
                    f"{_MAX_COMPAT} are read"
                )
            records = elf.section_bytes(data, compat).read(0, compat.size)
            accel = _compat_attr(records, _COMPAT_ARCH_SPECIFIC) == 1
        variant = "a" if accel else ""
        tkinfo = image.section(".note.nv.tkinfo")
        if not accel and tkinfo is not None and tkinfo.size < 4096:
            # `f` changes nothing in the cubin itself (nvcc manual: sm_100f and sm_100 SASS
            # are the same); ptxas's recorded command line is the only trace of it.
            text = elf.section_bytes(data, tkinfo).read(0, tkinfo.size)
            if f"sm_{sm}f".encode() in text:
                variant = "f"
        return Code("sass", sm, variant)


def _compat_attr(data: bytes, wanted: int) -> int | None:
    """One attribute of `.nv.compat`: 4-byte records (format, attribute, value), format 4
    carrying a u16 length and that many bytes (the EIFMT_* layout of `.nv.info`)."""
    pos = 0
    while pos + 4 <= len(data):
        record: tuple[int, int, int] = _RECORD.unpack_from(data, pos)
        fmt, attr, value = record
        if fmt == 4:
            pos += 4 + value
            continue
        if attr == wanted:
            return value & 0xFF if fmt == 2 else value
        pos += 4
    return None
