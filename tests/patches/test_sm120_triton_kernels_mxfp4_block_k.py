"""triton_kernels MXFP4 weights on capability 12: the patched old `_swizzle_mxfp4` asks
triton_kernels for exactly what 0.5.10's asks for; other capabilities ask for what they asked."""

from __future__ import annotations

from collections.abc import Mapping
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_triton_kernels_mxfp4_block_k import (
    TARGET,
    Sm120TritonKernelsMxfp4BlockK,
)
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

PATCH = Sm120TritonKernelsMxfp4BlockK()
PATH = "sglang/srt/layers/quantization/mxfp4.py"
FIXED = "0.5.10"
SM120 = {"is_persistent": False, "block_k": 128, "num_stages": 1}
# Three shapes: no helper (torch asked directly), `if _is_sm100_supported:` alone, and with sm90.
RELEASES = ["0.5.3", "0.5.5", "0.5.9"]


def matrix_expected(release: Version) -> str:
    if TARGET.get(release) is None:
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 gets the persistent-path layout and no block_k/num_stages:
    the tile triton_kernels then sizes needs more shared memory than one stage of SM120 has."""
    for capability in stand_ins.SM120:
        swizzle = stand_ins.run_swizzle(pristine[PATH], str(release), capability)
        assert swizzle.layout == "default"
        assert "block_k" not in swizzle.constraints and "num_stages" not in swizzle.constraints


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    if release >= Version(FIXED):
        # 0.5.12 dropped block_k=128 for a num_warps floor it patches into triton_kernels
        # (`_patch_sm120_mxfp4_min_warps`, stood in here); the layout and the rest stay.
        patch_warps = mock.Mock(name="_patch_sm120_mxfp4_min_warps")
        extra = {"_patch_sm120_mxfp4_min_warps": patch_warps}
        expected = SM120 if release < Version("0.5.12") else {**SM120, "block_k": None}
        for capability in stand_ins.SM120:
            swizzle = stand_ins.run_swizzle(patched[PATH], name, capability, extra)
            assert swizzle.layout == "strided"
            assert swizzle.constraints == {k: v for k, v in expected.items() if v is not None}
        return
    upstream = wheels.member(FIXED, PATH)
    for capability in stand_ins.SM120:
        assert stand_ins.run_swizzle(patched[PATH], name, capability) == stand_ins.run_swizzle(
            upstream, FIXED, capability
        )
    pristine = wheels.member(name, PATH)
    for capability in stand_ins.OTHERS:
        assert stand_ins.run_swizzle(patched[PATH], name, capability) == stand_ins.run_swizzle(
            pristine, name, capability
        )


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_asks_for_what_0_5_10_asks_for(
    release: str, capability: tuple[int, int]
) -> None:
    upstream = stand_ins.run_swizzle(wheels.member(FIXED, PATH), FIXED, capability)
    assert upstream == stand_ins.Swizzle("strided", SM120)
    assert (
        stand_ins.run_swizzle(wheels.patched(release, patch=PATCH), release, capability) == upstream
    )


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_unpatched_capability_12_gets_the_persistent_path_layout(
    release: str, capability: tuple[int, int]
) -> None:
    swizzle = stand_ins.run_swizzle(wheels.member(release, PATH), release, capability)
    assert swizzle == stand_ins.Swizzle("default", {})


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
def test_other_capabilities_ask_for_what_they_asked_for(
    release: str, capability: tuple[int, int]
) -> None:
    pristine = stand_ins.run_swizzle(wheels.member(release, PATH), release, capability)
    assert (
        stand_ins.run_swizzle(wheels.patched(release, patch=PATCH), release, capability) == pristine
    )
    assert pristine.layout == "default"


def test_b200_keeps_the_persistent_kernel() -> None:
    swizzle = stand_ins.run_swizzle(wheels.patched(SEED, patch=PATCH), SEED, (10, 0))
    assert swizzle == stand_ins.Swizzle("default", {"is_persistent": True, "epilogue_subtile": 1})
    assert stand_ins.run_swizzle(wheels.patched(SEED, patch=PATCH), SEED, (9, 0)).constraints == {
        "split_k": 1
    }


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
