"""sm120-double-sparsity-blocks: capability 12's own block sizes in double sparsity's extend launcher.

The choice proof runs each release's own launcher under stand-in capabilities; the compile proof
builds the release's own extend kernel for sm_120 with the sizes, warps and stages its launcher
passes, and reads the shared memory the launch asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_double_sparsity_blocks import Sm120DoubleSparsityBlocks
from tests.support import stand_ins_triton as triton_run
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DoubleSparsityBlocks()
REMOVED = "0.5.11"  # sgl-project/sglang#23009 deleted double sparsity
APPLIED = [r for r in wheels.RELEASES if Version(r) < Version(REMOVED)]
LAUNCHER = "extend_attention_fwd"
# The double-sparsity KV pool has one head size for K and V (MLA models get the MLA pool).
HEADS = (64, 80, 128, 160, 192, 256, 288, 384, 512)
# (BLOCK_M, BLOCK_N) the patch gives capability 12: the branch 0.5.9 gave the sibling kernel.
PATCHED = {64: (64, 128), 80: (64, 128), 128: (64, 128), 160: (64, 64), 192: (64, 64)}
PATCHED |= {256: (64, 64), 288: (32, 32), 384: (32, 32), 512: (32, 32)}
# The largest head of each of the patched branch's three sizes: a smaller head has a narrower
# tile with the same blocks, so these bound every head size the launcher admits.
WORST = (128, 256, 512)
LIMIT = triton_run.SM120_SHARED_MEMORY


def path(release: Version) -> str:
    target = PATCH.target_file(release)
    assert target is not None
    return f"sglang/{target}"


@cache
def pristine(release: str) -> bytes:
    return wheels.member(release, path(Version(release)))


def arguments(head: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The launcher's arguments for one prefill: 4 sequences, 16 heads, 4 KV heads."""
    tokens, heads, kv_heads, batch = 4096, 16, 4, 4
    fake = triton_run.FakeTensor
    q, o = fake(tokens, heads, head), fake(tokens, heads, head)
    k, v = fake(tokens, kv_heads, head), fake(tokens, kv_heads, head)
    k_buffer, v_buffer = fake(65536, kv_heads, head), fake(65536, kv_heads, head)
    req_to_tokens, per_request = fake(64, 8192, dtype="i32"), fake(batch, dtype="i32")
    lengths = (per_request, per_request, per_request, per_request)  # indices, lengths, starts
    return (q, k, v, o, k_buffer, v_buffer, req_to_tokens, *lengths, 1024, None, 0.0), {}


def choice(source: bytes, capability: tuple[int, int], head: int) -> tuple[int, ...]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) the release's own launcher passes."""
    namespace, recorder = triton_run.run_alone(source, (LAUNCHER,), capability)
    args, kwargs = arguments(head)
    namespace[LAUNCHER](*args, **kwargs)
    (launch,) = recorder.launches
    return tuple(launch.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))


def matrix_expected(release: Version) -> str:
    return "applied" if release < Version(REMOVED) else "not for this release"


def matrix_symptom(release: Version, pristine_files: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 takes Hopper's sizes."""
    source = pristine_files[path(release)]
    for capability in triton_run.CAPABILITY_12:
        for head in HEADS:
            assert choice(source, capability, head) == choice(source, (9, 0), head)


def matrix_effect(release: Version, patched_files: Mapping[str, bytes]) -> None:
    """Capability 12 takes its own sizes; every other capability chooses as before."""
    source = patched_files[path(release)]
    before = pristine(str(release))
    for head in HEADS:
        for capability in triton_run.CAPABILITY_12:
            chosen = choice(source, capability, head)
            # Warps and stages are the launcher's, unchanged.
            assert chosen == (*PATCHED[head], *choice(before, capability, head)[2:]), head
        for capability in triton_run.OTHER_CAPABILITIES:
            assert choice(source, capability, head) == choice(before, capability, head)


@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_takes_its_own_sizes(release: str) -> None:
    matrix_symptom(Version(release), {path(Version(release)): pristine(release)})
    matrix_effect(Version(release), {path(Version(release)): wheels.patched(release, patch=PATCH)})


def test_releases_from_0_5_11_have_no_double_sparsity() -> None:
    for release in wheels.RELEASES[len(APPLIED) :]:
        assert PATCH.target_file(Version(release)) is None
        assert not [m for m in wheels.members(release) if "double_sparsity" in m], release


def _shared(source: bytes, head: int) -> int:
    kernel, call = triton_run.launch(source, (12, 0), LAUNCHER, arguments(head))
    # The whole module's launcher agrees with the cut-out choice the matrix relies on.
    assert (call.kwargs["BLOCK_M"], call.kwargs["BLOCK_N"]) == choice(source, (12, 0), head)[:2]
    return triton_run.shared_memory(kernel, call).shared


# The oldest and the newest file: 0.5.3's and 0.5.10's differ in their imports, not the kernel.
@pytest.mark.parametrize("release", [APPLIED[0], APPLIED[-1]])
def test_the_kernel_fits_sm120_shared_memory_only_when_patched(release: str) -> None:
    """Compile the release's own kernel for sm_120 with its launcher's sizes at capability 12."""
    patched = wheels.patched(release, patch=PATCH)
    assert {head: _shared(patched, head) for head in WORST} == {
        128: 65536,
        256: 73728,
        512: 67584,
    }
    # Hopper's sizes: 114688 bytes with the 256-wide tile, 102400 with the 512-wide one.
    assert _shared(pristine(release), 256) == 114688 > LIMIT
    assert _shared(pristine(release), 512) == 102400 > LIMIT


def test_the_concerned_head_sizes_are_those_hopper_sizes_overflow() -> None:
    """`concerns.head_sizes` names the heads that take Hopper's (128, 64) with a 256-wide tile
    (114688 bytes) or (32, 64) with a 512-wide one (102400): compiled for every head size from 16
    to 528 in steps of 16 by hand, these two tiles and only these overflow up to 512; every head
    size up to 512 is mapped to its tile here."""
    source = pristine(APPLIED[-1])
    overflowing = set()
    for head in range(1, 513):
        block_m, block_n, *_ = choice(source, (12, 0), head)
        # The launcher pads the head to a power of two, but for 192 (128 + 64) and 288 (256 + 32).
        width = {192: 128, 288: 256}.get(head, 1 << (head - 1).bit_length())
        if (width, block_m, block_n) in ((256, 128, 64), (512, 32, 64)):
            overflowing.add(head)
    assert tuple(sorted(overflowing)) == PATCH.concerns.head_sizes


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
