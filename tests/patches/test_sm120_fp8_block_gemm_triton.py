"""sm120-fp8-block-gemm-triton, proven on real wheels by running each release's own fp8_utils.

Differential: a server starts (`initialize_fp8_gemm_config`), then asks
`dispatch_w8a8_block_fp8_linear()` for the block-FP8 linear kernel. On a stand-in GPU of
capability 12.0 and 12.1 the patched release answers exactly what 0.5.10 answers on the same
machine, whether DeepGEMM is on or off and FlashInfer installed or not; on 8.9, 9.0 and 10.0 it
answers what the unpatched release answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_deep_gemm_off import Sm120DeepGemmOff
from sglpatch.patches.sm120_fp8_block_gemm_triton import FP8_UTILS, Sm120Fp8BlockGemmTriton
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.stand_ins_gemm import Machine, configurer_flags, fp8_linear_choice

pytestmark = pytest.mark.wheel

PATCH = Sm120Fp8BlockGemmTriton()
DEEP_GEMM_OFF = Sm120DeepGemmOff()  # the other half of the choice (DeepGEMM off on 12)
FIXED = "0.5.10"
TWELVE = [(12, 0), (12, 1)]
OTHERS = [(8, 9), (9, 0), (10, 0)]
APPLIED = [r for r in wheels.RELEASES if Version("0.5.6.post2") <= Version(r) < Version(FIXED)]
TRITON = "triton_w8a8_block_fp8_linear"
FLASHINFER = "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback"
CUTLASS = "cutlass_w8a8_block_fp8_linear_with_fallback"
MEMBER = "sglang/srt/layers/quantization/fp8_utils.py"  # in every release, patched or not


def fp8_utils(release: Version) -> str:
    path = FP8_UTILS.get(release)
    assert path is not None
    return f"sglang/{path}"


@cache
def choice(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    deep_gemm_on: bool,
    flashinfer: bool = True,
    backend: str = "auto",
    env: tuple[tuple[str, str], ...] = (),
) -> str:
    flags = {"ENABLE_JIT_DEEPGEMM": deep_gemm_on, "DEEPGEMM_BLACKWELL": False}
    machine = Machine(capability, flashinfer=flashinfer, env=env)
    return fp8_linear_choice(source, release, machine, flags, backend)


def upstream(release: str, capability: tuple[int, int], deep_gemm_on: bool, **kw: bool) -> str:
    return choice(wheels.member(release, fp8_utils(Version(release))), release, capability,
                  deep_gemm_on, **kw)  # fmt: skip


def matrix_expected(release: Version) -> str:
    if release < Version("0.5.6.post2"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12.0 with DeepGEMM off and FlashInfer installed gets the SM100-only GEMM."""
    source = pristine[fp8_utils(release)]
    assert choice(source, str(release), (12, 0), False) == FLASHINFER


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Capability 12 never reaches DeepGEMM or FlashInfer's TRT-LLM GEMM on `auto`: Triton,
    as 0.5.10 chose (0.5.16+ choose their own SM120 CUTLASS path); 10.0 keeps FlashInfer."""
    source, name = patched[fp8_utils(release)], str(release)
    expected = CUTLASS if release >= Version("0.5.16") else TRITON
    assert choice(source, name, (12, 0), True) == expected
    assert choice(source, name, (12, 1), False) == expected
    assert choice(source, name, (10, 0), False) == FLASHINFER


@pytest.mark.parametrize("release", APPLIED)
@pytest.mark.parametrize("capability", TWELVE, ids=["12.0", "12.1"])
@pytest.mark.parametrize("deep_gemm_on", [False, True], ids=["deepgemm-off", "deepgemm-on"])
@pytest.mark.parametrize("flashinfer", [True, False], ids=["flashinfer", "no-flashinfer"])
def test_capability_12_chooses_what_0_5_10_chooses(
    release: str, capability: tuple[int, int], deep_gemm_on: bool, flashinfer: bool
) -> None:
    ours = choice(
        wheels.patched(release, patch=PATCH), release, capability, deep_gemm_on, flashinfer
    )
    assert ours == upstream(FIXED, capability, deep_gemm_on, flashinfer=flashinfer)
    assert ours == TRITON


@pytest.mark.parametrize("release", APPLIED)
@pytest.mark.parametrize("capability", OTHERS, ids=["8.9", "9.0", "10.0"])
def test_other_capabilities_are_untouched(release: str, capability: tuple[int, int]) -> None:
    pristine = wheels.member(release, fp8_utils(Version(release)))
    ours = wheels.patched(release, patch=PATCH)
    for deep_gemm_on in (False, True):
        for flashinfer in (True, False):
            assert choice(ours, release, capability, deep_gemm_on, flashinfer) == (
                choice(pristine, release, capability, deep_gemm_on, flashinfer)
            )


@pytest.mark.parametrize("release", APPLIED)
def test_explicit_choices_are_obeyed_on_capability_12(release: str) -> None:
    """Only `auto` changes: `--fp8-gemm-backend cutlass` and the deprecated
    SGLANG_ENABLE_FLASHINFER_FP8_GEMM=1 still get what they ask for, as before."""
    pristine = wheels.member(release, fp8_utils(Version(release)))
    for kw in ({"backend": "cutlass"}, {"env": (("SGLANG_ENABLE_FLASHINFER_FP8_GEMM", "1"),)}):
        ours = choice(wheels.patched(release, patch=PATCH), release, (12, 0), False, True, **kw)  # type: ignore[arg-type]
        assert ours == choice(pristine, release, (12, 0), False, True, **kw)  # type: ignore[arg-type]
        assert ours != TRITON


@pytest.mark.parametrize("release", APPLIED)
def test_unpatched_capability_12_gets_sm100_or_deep_gemm_kernels(release: str) -> None:
    pristine = wheels.member(release, fp8_utils(Version(release)))
    for capability in TWELVE:
        assert choice(pristine, release, capability, False) == FLASHINFER
        assert choice(pristine, release, capability, True).startswith("deepgemm_")


@pytest.mark.parametrize("release", [r for r in wheels.RELEASES if Version(r) < Version("0.5.21")])
@pytest.mark.parametrize("capability", TWELVE, ids=["12.0", "12.1"])
def test_what_a_capability_12_user_gets_with_both_gemm_patches(
    release: str, capability: tuple[int, int]
) -> None:
    """The whole FP8 block-GEMM choice on a patched release (DeepGEMM installed without SM120
    kernels, FlashInfer installed, `auto`): Triton, or from 0.5.16 upstream's SM120 CUTLASS."""
    version = Version(release)
    deep_gemm = configurer_flags(
        wheels.patched(release, patch=DEEP_GEMM_OFF), release, Machine(capability)
    )
    assert not deep_gemm["ENABLE_JIT_DEEPGEMM"]
    source = (
        wheels.patched(release, patch=PATCH)
        if release in APPLIED
        else wheels.member(release, MEMBER)
    )
    chosen = fp8_linear_choice(source, release, Machine(capability), deep_gemm)
    assert chosen == (CUTLASS if version >= Version("0.5.16") else TRITON)


def _calls(source: bytes, release: str, capability: tuple[int, int], deep_gemm_on: bool) -> int:
    """How often a server start-up and one block-FP8 dispatch call the functions the patch
    declares unreached on 12 (`unreached_on_12`, read by doctor's coverage)."""
    called = dict.fromkeys(PATCH.unreached_on_12, 0)
    flags = {"ENABLE_JIT_DEEPGEMM": deep_gemm_on, "DEEPGEMM_BLACKWELL": False}
    fp8_linear_choice(source, release, Machine(capability), flags, called=called)
    return sum(called.values())


@pytest.mark.parametrize("release", APPLIED)
def test_the_functions_it_declares_unreached_are_unreached_on_12_only(release: str) -> None:
    assert PATCH.unreached_on_12  # doctor covers fp8_utils' automatic choice by this
    pristine = wheels.member(release, fp8_utils(Version(release)))
    for deep_gemm_on in (False, True):
        for capability in TWELVE:
            assert _calls(pristine, release, capability, deep_gemm_on) > 0
            assert (
                _calls(wheels.patched(release, patch=PATCH), release, capability, deep_gemm_on) == 0
            )
        for capability in OTHERS:
            assert (
                _calls(wheels.patched(release, patch=PATCH), release, capability, deep_gemm_on) > 0
            )


def test_before_0_5_6_post2_there_is_no_automatic_choice() -> None:
    assert PATCH.target_file(Version("0.5.6.post1")) is None
    source = wheels.member("0.5.6.post1", MEMBER)
    assert b"def initialize_fp8_gemm_config" not in source
    assert choice(source, "0.5.6.post1", (12, 0), False) == TRITON  # FlashInfer is opt-in there


def test_upstream_releases_are_left_alone() -> None:
    for release in ("0.5.10", "0.5.16", "0.5.23"):
        wheels.assert_left_alone(PATCH, release)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
