"""What a damaged or hostile library costs the reader: its headers, never its size.

Every file is built here with `struct` (sparse where it is large); `os.pread` is wrapped to
count what is read and to fail the test as soon as more than a budget is read, so a reader that
walks a file's bytes fails at once instead of spending a minute on 16 GiB of holes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sglpatch.doctor.kernels import elf, fatbin
from tests.test_kernels_elf import EM_X86_64, SASS, build_elf, container, entry

_SHDR = struct.Struct("<IIQQQQIIQQ")
GIB = 1 << 30


class Reads:
    """Every `os.pread`: how many, how many bytes; more than `budget` bytes fails the test."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.calls = 0
        self.bytes = 0

    def __repr__(self) -> str:
        return f"{self.calls} reads, {self.bytes} bytes"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    counter = Reads(budget=1 << 20)
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        data = pread(fd, length, offset)
        counter.calls += 1
        counter.bytes += len(data)
        if counter.bytes > counter.budget:
            raise AssertionError(f"read past the budget of {counter.budget} bytes: {counter}")
        return data

    monkeypatch.setattr(os, "pread", counted)
    yield counter


def write_elf(
    path: Path,
    size: int,
    sections: Sequence[tuple[int, int, int]],
    names: bytes,
    *,
    names_at: int,
    table_at: int,
    writes: Sequence[tuple[int, bytes]] = (),
) -> Path:
    """An ELF64 file of `size` bytes, holes wherever nothing is written: the null section,
    `sections` as (name offset, file offset, size), then the name table `names` (named by
    offset 0) at `names_at`; the section table at `table_at`; `writes` as (offset, bytes)."""
    rows = [(0, 0, 0, 0), *((n, 1, o, s) for n, o, s in sections), (0, 3, names_at, len(names))]
    table = b"".join(_SHDR.pack(n, kind, 0, 0, o, s, 0, 0, 1, 0) for n, kind, o, s in rows)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0, 0]) + b"\0" * 7
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, EM_X86_64, 1, 0, 0, table_at, 0, 64, 0, 0, 64, len(rows), len(rows) - 1
    )
    with path.open("wb") as handle:
        handle.truncate(size)
        for at, data in ((0, header), (table_at, table), (names_at, names), *writes):
            handle.seek(at)
            handle.write(data)
    return path


@pytest.mark.parametrize("first", [b"", container(entry(SASS, 120))], ids=["zeros", "one-then"])
def test_a_16_gib_sparse_fatbin_section_costs_a_few_reads(
    tmp_path: Path, reads: Reads, first: bytes
) -> None:
    """The review's 16 GiB `.nv_fatbin` of holes (58 s before): zeros where a container
    should start are damage, found in one read, whether at the section's start or after a
    container; never searched for a magic number to the section's end."""
    size = 16 * GIB
    path = write_elf(
        tmp_path / "libsparse.so",
        size,
        [(1, 4096, size - 8192)],
        b"\0.nv_fatbin\0",
        names_at=size - 4096,
        table_at=size - 4096 + 64,
        writes=[(4096, first)],
    )
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse: the test writes a few pages
    with pytest.raises(elf.BadBinary, match=r"zeros from section offset \d+ past 4096 bytes"):
        fatbin.codes_in_library(path)
    assert reads.calls <= 8 and reads.bytes <= 32 << 10, reads


def test_65533_section_headers_are_refused_before_they_are_read(
    tmp_path: Path, reads: Reads
) -> None:
    """The review's 5 MB file: 65,533 headers, every name at the start of a 1 MB table with
    no NUL (3.4 GB of memory before). Past 4,096 sections the table is not even read."""
    count = 65_533 - 2
    table_at = 4096
    names_at = table_at + (count + 2) * _SHDR.size
    path = write_elf(
        tmp_path / "libheaders.so",
        names_at + (1 << 20),
        [(0, 0, 0)] * count,
        b"x" * (1 << 20),
        names_at=names_at,
        table_at=table_at,
    )
    with pytest.raises(elf.BadBinary, match=r"damaged section table \(65533 entries"):
        fatbin.codes_in_library(path)
    assert reads.bytes <= 8 << 10, reads


def test_names_are_read_to_4096_bytes_and_no_further(tmp_path: Path, reads: Reads) -> None:
    """4,000 headers under the cap, their names in a 1 MB table without a NUL: the first name
    is damage after 4 KiB of it (before: each name read to the table's end, 4 GB in all).
    Long names are not damage in themselves: flashinfer-cubin's cubins carry mangled kernel
    names of up to 271 bytes."""
    count = 4000
    table_at = 4096
    names_at = table_at + (count + 2) * _SHDR.size
    path = write_elf(
        tmp_path / "libnames.so",
        names_at + (1 << 20),
        [(0, 0, 0)] * count,
        b"x" * (1 << 20),
        names_at=names_at,
        table_at=table_at,
    )
    with pytest.raises(elf.BadBinary, match="longer than 4096 bytes"):
        fatbin.codes_in_library(path)
    assert reads.bytes <= (count + 2) * _SHDR.size + (16 << 10), reads

    fat = (".nv_fatbin", container(entry(SASS, 120)))
    for length, readable in ((271, True), (4096, True), (4097, False)):
        path = tmp_path / f"lib{length}.so"
        path.write_bytes(build_elf([(".text." + "x" * (length - 6), b"\0"), fat]))
        if readable:
            assert {c.name for c in fatbin.codes_in_library(path)[0]} == {"sm_120"}
        else:
            with pytest.raises(elf.BadBinary, match="longer than 4096 bytes"):
                fatbin.codes_in_library(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\0" * 1024, "the section holds no container"),
        (b"\0" * 8192, "zeros from section offset 0 past 4096 bytes"),
        (container() * 3, "3 containers and no SASS or PTX entry"),
        (container(entry(3, 120)), "1 container and no SASS or PTX entry"),
        (container(entry(SASS, 120)) + b"\0" * 8 + b"junk" * 8, "no container at section offset"),
        (container() * 40_000, "more than 32768 container and entry headers"),
    ],
    ids=["zeros", "zeros-past-a-page", "empty-containers", "no-code-entry", "junk", "too-many"],
)
def test_a_fatbin_section_without_code_is_damage(
    tmp_path: Path, reads: Reads, content: bytes, message: str
) -> None:
    """A section holding no readable container says nothing of the GPU: it is damage (the
    package "not judged"), never a library without code for capability 12."""
    path = tmp_path / "libempty.so"
    path.write_bytes(build_elf([(".text", b"\x90"), (".nv_fatbin", content)]))
    with pytest.raises(elf.BadBinary, match=message):
        fatbin.codes_in_library(path)


def test_a_16_gib_nv_compat_in_a_cubin_is_not_walked(tmp_path: Path, reads: Reads) -> None:
    """`.nv.compat` is walked four bytes at a time: a huge one (16 bytes at most in
    flashinfer-cubin's 5,363 cubins) is damage, not 4 billion steps."""
    size = 16 * GIB
    path = write_elf(
        tmp_path / "k.cubin",
        size,
        [(1, 4096, size - 8192)],
        b"\0.nv.compat\0",
        names_at=size - 4096,
        table_at=size - 4096 + 64,
    )
    with path.open("r+b") as handle:  # a CUDA 13 ABI cubin for sm_120, `a` left to .nv.compat
        handle.seek(7)
        handle.write(bytes([0x41, 8]))
        handle.seek(18)
        handle.write(struct.pack("<H", elf.EM_CUDA))
        handle.seek(48)
        handle.write(struct.pack("<I", 0x06007802))
    with pytest.raises(elf.BadBinary, match=r"damaged cubin: \.nv\.compat claims"):
        fatbin.cubin_code(path)
    assert reads.bytes <= 32 << 10, reads
