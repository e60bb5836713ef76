"""sm120-prefill-attention-block: `BLOCK = 64` on capability 12 in the Triton prefill launcher.

No release up to 0.5.23 has fixed it, so the differential proof compares with the rule the open
upstream pull request proposes (64 on capability 12, everything else as before); the compile proof
builds the release's own prefill kernel for sm_120 with the block its launcher picks.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_prefill_attention_block import Sm120PrefillAttentionBlock
from tests.support import stand_ins_triton as triton_run
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

PATCH = Sm120PrefillAttentionBlock()
HEAD_DIMS = (64, 80, 128, 256)
LIMIT = triton_run.SM120_SHARED_MEMORY
# ROCm reports its gfx major as the capability: gfx12 (RDNA4) says 12 and must keep its block.
HIP_CAPABILITIES = ((9, 4), (12, 0))


def path(release: Version) -> str:
    target = PATCH.target_file(release)
    assert target is not None
    return f"sglang/{target}"


@cache
def pristine(release: str) -> bytes:
    return wheels.member(release, path(Version(release)))


def matrix_expected(release: Version) -> str:
    return "applied"  # no release up to 0.5.23 has a capability-12 branch here


def matrix_symptom(release: Version, pristine_files: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 launches with blocks of 128, as Hopper does."""
    source = pristine_files[path(release)]
    for capability in triton_run.CAPABILITY_12:
        block_m, block_n, _ = triton_run.prefill_choice(source, capability, 256)
        assert (block_m, block_n) == (128, 128)


def matrix_effect(release: Version, patched_files: Mapping[str, bytes]) -> None:
    """Capability 12 launches with blocks of 64, the pull request's rule, with the warps it had;
    every other device exactly as before."""
    source = patched_files[path(release)]
    before = pristine(str(release))
    for head_dim in HEAD_DIMS:
        for capability in triton_run.CAPABILITY_12:
            block_m, block_n, warps = triton_run.prefill_choice(source, capability, head_dim)
            assert (block_m, block_n) == (64, 64)
            assert warps == triton_run.prefill_choice(before, capability, head_dim)[2]
        for capability in triton_run.OTHER_CAPABILITIES:
            assert triton_run.prefill_choice(source, capability, head_dim) == (
                triton_run.prefill_choice(before, capability, head_dim)
            ), (capability, head_dim)
        for capability in HIP_CAPABILITIES:
            assert triton_run.prefill_choice(source, capability, head_dim, hip=True) == (
                triton_run.prefill_choice(before, capability, head_dim, hip=True)
            ), ("hip", capability, head_dim)


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_capability_12_launches_with_blocks_of_64(release: str) -> None:
    version = Version(release)
    matrix_symptom(version, {path(version): pristine(release)})
    matrix_effect(version, {path(version): wheels.patched(release, patch=PATCH)})


def _launch(source: bytes, head_dim: int) -> triton_run.Compiled:
    kernel, call = triton_run.launch(
        source, (12, 0), "context_attention_fwd", triton_run.prefill_args(head_dim)
    )
    chosen = (call.kwargs["BLOCK_M"], call.kwargs["BLOCK_N"], call.kwargs["num_warps"])
    assert chosen == triton_run.prefill_choice(source, (12, 0), head_dim)
    return triton_run.shared_memory(kernel, call)


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_the_kernel_fits_sm120_shared_memory_only_when_patched(release: str) -> None:
    """Compile the release's own kernel for sm_120 with the block its launcher picks."""
    assert _launch(pristine(release), 256).shared > LIMIT
    for head_dim in (128, 256):
        assert _launch(wheels.patched(release, patch=PATCH), head_dim).shared <= LIMIT


def test_the_issue_figures() -> None:
    """Head size 256 at capability 12: 163840 bytes with BLOCK = 128, 73728 with 64."""
    assert _launch(pristine(SEED), 256).shared == 163840
    assert _launch(wheels.patched(SEED, patch=PATCH), 256).shared == 73728


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
