"""The ELF, fat-binary and cubin readers, on small binaries built here byte by byte.

The layouts copy what nvcc 12.9/13.0 write (measured by hand with cuobjdump; see
docs/kernels-readme-draft.md); no vendor binary is in the repository.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path

import pytest

from sglpatch.doctor.kernels import elf, fatbin
from sglpatch.doctor.kernels.archs import Code, parse_capability, runs_on

EM_X86_64 = 62
PTX, SASS = 1, 2
LINUX_64 = 0x11  # FATBIN 64-bit | Linux, as on every entry nvcc writes for Linux


def entry(kind: int, sm: int, flags: int = LINUX_64, payload: bytes = b"", size: int = 64) -> bytes:
    """One fat binary entry: header (`size` bytes, 64 or the 80/112 of sm_100+), payload."""
    head = struct.pack(
        "<HHIQIIHHIIIQ", kind, 0x0101, size, len(payload), 0, 0, 8, 1, sm, 0, 0, flags
    )
    return head.ljust(size, b"\0") + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def build_elf(
    sections: list[tuple[str, bytes]],
    *,
    machine: int = EM_X86_64,
    flags: int = 0,
    osabi: int = 0,
    abi_version: int = 0,
) -> bytes:
    """A minimal ELF64 little-endian file: header, section data, names, section table."""
    names = b"\0"
    offsets = []
    data = b""
    for name, content in sections:
        offsets.append((len(names), 64 + len(data), len(content)))
        names += name.encode() + b"\0"
        data += content + b"\0" * (-len(content) % 8)
    shstr_name = len(names)
    names += b".shstrtab\0"
    shstr_off = 64 + len(data)
    data += names + b"\0" * (-len(names) % 8)
    shoff = 64 + len(data)
    table = b"\0" * 64  # section 0
    for name_off, off, size in offsets:
        table += struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, off, size, 0, 0, 1, 0)
    table += struct.pack("<IIQQQQIIQQ", shstr_name, 3, 0, 0, shstr_off, len(names), 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, osabi, abi_version]) + b"\0" * 7
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        3,
        machine,
        1,
        0,
        0,
        shoff,
        flags,
        64,
        0,
        0,
        64,
        len(sections) + 2,
        len(sections) + 1,
    )
    return header + data + table


def library(tmp_path: Path, *containers: bytes, section: str = ".nv_fatbin") -> Path:
    path = tmp_path / "libk.so"
    path.write_bytes(build_elf([(".text", b"\x90" * 16), (section, b"".join(containers))]))
    return path


def names(codes: Counter[Code]) -> set[str]:
    return {c.name for c in codes}


def test_sass_ptx_and_variants(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        container(
            entry(SASS, 90, LINUX_64 | fatbin.FLAG_ARCH_SPECIFIC),
            entry(SASS, 100, LINUX_64 | fatbin.FLAG_FAMILY_SPECIFIC, b"x" * 40, size=112),
            entry(SASS, 120, payload=b"\x7fELF" + b"\0" * 60, size=112),
            entry(SASS, 120, LINUX_64 | fatbin.FLAG_ARCH_SPECIFIC, size=112),
            entry(PTX, 120, LINUX_64 | fatbin.FLAG_COMPRESSED_ZSTD, b"(\xb5/\xfd" + b"z" * 9, 80),
        ),
    )
    codes, compressed, section = fatbin.codes_in_library(lib)
    assert names(codes) == {"sm_90a", "sm_100f", "sm_120", "sm_120a", "compute_120"}
    assert (compressed, section) == (1, ".nv_fatbin")


def test_several_containers_padding_and_counts(tmp_path: Path) -> None:
    one = container(entry(SASS, 80), entry(SASS, 120, LINUX_64 | fatbin.FLAG_ARCH_SPECIFIC))
    two = container(entry(SASS, 80), entry(PTX, 90, LINUX_64 | fatbin.FLAG_COMPRESSED_LZ4))
    lib = library(tmp_path, one, b"\0" * 8, two, b"\0" * 200, one)
    codes, compressed, _ = fatbin.codes_in_library(lib)
    assert codes == Counter({Code("sass", 80): 3, Code("sass", 120, "a"): 2, Code("ptx", 90): 1})
    assert compressed == 1


def test_relocatable_fatbin_only_without_linked_one(tmp_path: Path) -> None:
    rel = library(tmp_path, container(entry(SASS, 120)), section="__nv_relfatbin")
    codes, _, section = fatbin.codes_in_library(rel)
    assert (names(codes), section) == ({"sm_120"}, "__nv_relfatbin")
    both = tmp_path / "both.so"
    both.write_bytes(
        build_elf(
            [
                ("__nv_relfatbin", container(entry(SASS, 120))),
                (".nv_fatbin", container(entry(SASS, 90))),
            ]
        )
    )
    assert names(fatbin.codes_in_library(both)[0]) == {"sm_90"}


def test_cpu_only_library_has_no_codes(tmp_path: Path) -> None:
    path = tmp_path / "libc.so"
    path.write_bytes(build_elf([(".text", b"\x90")]))
    assert fatbin.codes_in_library(path) == (Counter(), 0, "")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "truncated ELF"),
        (b"\x7fELF\x02\x01", "truncated ELF"),
        (b"MZ" + b"\0" * 100, "not an ELF file"),
        (b"\x7fELF\x01\x01\x01" + b"\0" * 100, "not a 64-bit little-endian ELF"),
    ],
)
def test_bad_headers(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.so"
    path.write_bytes(content)
    with pytest.raises(elf.BadBinary, match=message):
        fatbin.codes_in_library(path)


def test_truncated_section_table(tmp_path: Path) -> None:
    whole = library(tmp_path, container(entry(SASS, 120))).read_bytes()
    path = tmp_path / "cut.so"
    path.write_bytes(whole[: len(whole) - 70])
    with pytest.raises(elf.BadBinary, match="truncated ELF"):
        fatbin.codes_in_library(path)


def test_fat_binary_with_a_wrong_size(tmp_path: Path) -> None:
    good = container(entry(SASS, 120, payload=b"p" * 16))
    lying = good[:8] + struct.pack("<Q", 10_000) + good[16:]
    with pytest.raises(elf.BadBinary, match="damaged fat binary"):
        fatbin.codes_in_library(library(tmp_path, lying))
    short_entry = good[:16] + struct.pack("<HHIQ", SASS, 0x101, 64, 9_999) + good[32:]
    with pytest.raises(elf.BadBinary, match="damaged fat binary entry"):
        fatbin.codes_in_library(library(tmp_path, short_entry))


def test_not_regular_files(tmp_path: Path) -> None:
    folder = tmp_path / "common_ops.abi3.so"
    folder.mkdir()
    with pytest.raises(elf.BadBinary, match=r"not a regular file|cannot open"):
        fatbin.codes_in_library(folder)
    fifo = tmp_path / "fifo.so"
    os.mkfifo(fifo)
    with pytest.raises(elf.BadBinary, match="not a regular file"):
        fatbin.codes_in_library(fifo)  # opened without waiting for a writer: no hang
    with pytest.raises(elf.BadBinary, match="cannot open"):
        fatbin.codes_in_library(tmp_path / "missing.so")


def cubin(tmp_path: Path, flags: int, abi: int, extra: list[tuple[str, bytes]]) -> Path:
    path = tmp_path / f"k{flags:x}-{abi}-{len(extra)}.cubin"
    osabi = 0x33 if abi == 7 else 0x41
    path.write_bytes(
        build_elf(
            [(".text.k", b"\0" * 16), *extra],
            machine=elf.EM_CUDA,
            flags=flags,
            osabi=osabi,
            abi_version=abi,
        )
    )
    return path


def compat(arch_specific: int) -> bytes:
    # .nv.compat as ptxas 13.0 writes it: attribute 9 is 1 for sm_XYa, 0 otherwise.
    return bytes([2, 9, arch_specific, 0, 2, 2, 1, 0, 4, 11, 8, 0]) + b"P" + b"\0" * 7


@pytest.mark.parametrize(
    ("flags", "abi", "extra", "name"),
    [
        (0x005A055A, 7, [], "sm_90"),  # ptxas 12.9, -arch sm_90
        (0x005A0D5A, 7, [], "sm_90a"),  # ptxas 12.9, -arch sm_90a (EF_CUDA_ACCELERATORS_V1)
        (0x06007802, 8, [], "sm_120"),
        (0x0600780A, 8, [], "sm_120a"),  # ptxas 12.9, -arch sm_120a (EF_CUDA_ACCELERATORS)
        (0x06007802, 8, [(".nv.compat", compat(1))], "sm_120a"),  # ptxas 13.0, sm_120a
        (0x06007802, 8, [(".nv.compat", compat(0))], "sm_120"),
        (0x06007902, 8, [(".note.nv.tkinfo", b"ptxas\0-arch sm_121f \0")], "sm_121f"),
        (0x06006402, 8, [(".note.nv.tkinfo", b"-arch sm_100f ")], "sm_100f"),
    ],
)
def test_cubin_architecture(
    tmp_path: Path, flags: int, abi: int, extra: list[tuple[str, bytes]], name: str
) -> None:
    assert fatbin.cubin_code(cubin(tmp_path, flags, abi, extra)).name == name


def test_a_host_library_is_not_a_cubin(tmp_path: Path) -> None:
    with pytest.raises(elf.BadBinary, match="not a cubin"):
        fatbin.cubin_code(library(tmp_path, container(entry(SASS, 120))))


@pytest.mark.parametrize(
    ("code", "on_120", "on_121"),
    [
        (Code("sass", 120), True, True),
        (Code("sass", 120, "f"), True, True),
        (Code("sass", 120, "a"), True, False),
        (Code("sass", 121), False, True),
        (Code("sass", 121, "a"), False, True),
        (Code("sass", 100, "a"), False, False),
        (Code("sass", 100), False, False),
        (Code("sass", 90), False, False),
        (Code("sass", 86), False, False),
        (Code("ptx", 90), True, True),  # PTX is JIT-compiled for any newer GPU
        (Code("ptx", 120), True, True),
        (Code("ptx", 120, "a"), True, False),
        (Code("ptx", 120, "f"), True, True),
        (Code("ptx", 100, "f"), False, False),
        (Code("ptx", 121), False, True),
    ],
)
def test_cuda_compatibility_rules(code: Code, on_120: bool, on_121: bool) -> None:
    assert runs_on(code, (12, 0)) is on_120
    assert runs_on(code, (12, 1)) is on_121


def test_capability_text() -> None:
    assert parse_capability("12.1") == (12, 1)
    assert parse_capability("12") is None
    assert parse_capability("x.y") is None


def test_a_section_far_in_a_2_gib_file_is_read_by_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sparse 2 GiB library whose fat binary's payloads are 600 MiB holes and whose section
    table lies in its last page: the codes are found, without a memory map, and only the
    headers are read (a few pages, not the gigabytes)."""
    import mmap

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reader mapped the file")

    monkeypatch.setattr(mmap, "mmap", refused)
    read: list[int] = []
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        data = pread(fd, length, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted)

    hole = 600 << 20
    first = entry(SASS, 120, LINUX_64 | fatbin.FLAG_ARCH_SPECIFIC)[:64]
    second = entry(PTX, 120)[:64]
    third = entry(SASS, 90)
    # Entry headers claim `hole` bytes of payload each; the payloads are never written.
    first = first[:8] + struct.pack("<Q", hole) + first[16:]
    second = second[:8] + struct.pack("<Q", hole) + second[16:]
    body = len(first) + hole + len(second) + hole + len(third)
    head = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, body)
    fat_at, size = 4096, 2 << 30
    table_at = size - 4096
    names = b"\0.nv_fatbin\0.shstrtab\0"
    shoff = table_at + 64
    table = b"\0" * 64
    table += struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, fat_at, 16 + body, 0, 0, 1, 0)
    table += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, table_at, len(names), 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0, 0]) + b"\0" * 7
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, EM_X86_64, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2
    )
    path = tmp_path / "libhuge.so"
    with path.open("wb") as handle:
        handle.truncate(size)
        for at, data in (
            (0, header),
            (fat_at, head + first),
            (fat_at + 16 + len(first) + hole, second),
            (fat_at + 16 + len(first) + hole + len(second) + hole, third),
            (table_at, names.ljust(64, b"\0") + table),
        ):
            handle.seek(at)
            handle.write(data)
    assert path.stat().st_size == size

    codes, compressed, section = fatbin.codes_in_library(path)
    assert codes == Counter({Code("sass", 120, "a"): 1, Code("ptx", 120): 1, Code("sass", 90): 1})
    assert (compressed, section) == (0, ".nv_fatbin")
    assert sum(read) < 64 << 10, read


def test_a_file_that_shrinks_while_read_is_a_bad_binary(tmp_path: Path) -> None:
    path = library(tmp_path, container(entry(SASS, 120)))
    with elf.opened(path) as data:
        image = elf.parse(data)
        section = image.section(".nv_fatbin")
        assert section is not None
        os.truncate(path, section.offset)
        with pytest.raises(elf.BadBinary, match="shrank"):
            fatbin.read_fatbin(elf.section_bytes(data, section))
