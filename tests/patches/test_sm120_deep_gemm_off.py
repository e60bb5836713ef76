"""sm120-deep-gemm-off, proven on real wheels by running each release's own configurer.

Differential: on a stand-in GPU of capability 12.0 and 12.1, the patched configurer of every
release it applies to switches DeepGEMM exactly as the first release that fixed that capability
(0.5.13 for 12.0, 0.5.21 for 12.1) does on the same machine; on 8.9, 9.0 and 10.0 it sets every
flag exactly as the unpatched code does.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_deep_gemm_off import CONFIGURER, Sm120DeepGemmOff
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.stand_ins_gemm import DeepGemm, Machine, configurer_flags

pytestmark = pytest.mark.wheel

PATCH = Sm120DeepGemmOff()
FIXED = {(12, 0): "0.5.13", (12, 1): "0.5.21"}  # first release that keeps DeepGEMM off there
TWELVE = list(FIXED)
OTHERS = [(8, 9), (9, 0), (10, 0)]
APPLIED = [r for r in wheels.RELEASES if Version(r) < Version("0.5.21")]
# DeepGEMM builds without SM120 kernels: what every release up to 0.5.19 runs with.
PRE_SM120: list[DeepGemm] = ["absent", "hopper-blackwell"]
ALL_BUILDS: list[DeepGemm] = [*PRE_SM120, "sm120"]


def configurer(release: Version) -> str:
    path = CONFIGURER.get(release)
    assert path is not None
    return f"sglang/{path}"


def flags(
    source: bytes, release: str, capability: tuple[int, int], deep_gemm: DeepGemm
) -> dict[str, bool]:
    return configurer_flags(source, release, Machine(capability, deep_gemm))


def upstream(release: str, capability: tuple[int, int], deep_gemm: DeepGemm) -> dict[str, bool]:
    return flags(
        wheels.member(release, configurer(Version(release))), release, capability, deep_gemm
    )


def matrix_expected(release: Version) -> str:
    return "applied" if release < Version("0.5.21") else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12.1 (and 12.0 before 0.5.13) turns DeepGEMM on with a pre-SM120 build."""
    source, name = pristine[configurer(release)], str(release)
    assert flags(source, name, (12, 1), "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
    on_120 = flags(source, name, (12, 0), "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
    assert on_120 == (release < Version("0.5.13"))


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """12.0 and 12.1 keep DeepGEMM off with a pre-SM120 build; 10.0 keeps its SM100 DeepGEMM."""
    source, name = patched[configurer(release)], str(release)
    for capability in TWELVE:
        result = flags(source, name, capability, "hopper-blackwell")
        assert not result["ENABLE_JIT_DEEPGEMM"] and not result["DEEPGEMM_BLACKWELL"], capability
    sm100 = flags(source, name, (10, 0), "hopper-blackwell")
    assert sm100["ENABLE_JIT_DEEPGEMM"] and sm100["DEEPGEMM_BLACKWELL"]


def _common(left: Mapping[str, bool], right: Mapping[str, bool]) -> tuple[dict, dict]:
    """The flags both releases define (DEEPGEMM_NEED_TMA_ALIGNED_SCALES appeared in 0.5.11)."""
    keys = left.keys() & right.keys()
    assert "ENABLE_JIT_DEEPGEMM" in keys
    return {k: left[k] for k in keys}, {k: right[k] for k in keys}


@pytest.mark.parametrize("release", APPLIED)
@pytest.mark.parametrize("capability", TWELVE, ids=["12.0", "12.1"])
@pytest.mark.parametrize("deep_gemm", PRE_SM120)
def test_capability_12_switches_like_the_first_fixing_release(
    release: str, capability: tuple[int, int], deep_gemm: DeepGemm
) -> None:
    ours = flags(wheels.patched(release, patch=PATCH), release, capability, deep_gemm)
    theirs = upstream(FIXED[capability], capability, deep_gemm)
    assert _common(ours, theirs)[0] == _common(ours, theirs)[1]
    assert not ours["ENABLE_JIT_DEEPGEMM"]


@pytest.mark.parametrize("capability", TWELVE, ids=["12.0", "12.1"])
def test_on_0_5_20_an_sm120_deep_gemm_is_used_like_0_5_21_uses_it(
    capability: tuple[int, int],
) -> None:
    """0.5.20 already runs an SM120 DeepGEMM on 12.0; patched, 12.1 joins it, as in 0.5.21."""
    ours = flags(wheels.patched("0.5.20", patch=PATCH), "0.5.20", capability, "sm120")
    theirs = upstream("0.5.21", capability, "sm120")
    assert ours == theirs
    assert ours["ENABLE_JIT_DEEPGEMM"] and ours["DEEPGEMM_SCALE_UE8M0"]
    assert not ours["DEEPGEMM_BLACKWELL"]  # never the SM100 kernels


@pytest.mark.parametrize("release", [r for r in APPLIED if Version(r) < Version("0.5.20")])
@pytest.mark.parametrize("capability", TWELVE, ids=["12.0", "12.1"])
def test_before_0_5_20_even_an_sm120_deep_gemm_stays_off(
    release: str, capability: tuple[int, int]
) -> None:
    """These releases have no SM120 DeepGEMM code paths: 0.5.13's rule, unconditionally.

    (0.5.21 would use such a build on 12.1, with SM120 scale formats these releases lack.)
    """
    assert not flags(wheels.patched(release, patch=PATCH), release, capability, "sm120")[
        "ENABLE_JIT_DEEPGEMM"
    ]


@pytest.mark.parametrize("release", APPLIED)
@pytest.mark.parametrize("capability", OTHERS, ids=["8.9", "9.0", "10.0"])
def test_other_capabilities_are_untouched(release: str, capability: tuple[int, int]) -> None:
    pristine = wheels.member(release, configurer(Version(release)))
    for deep_gemm in ALL_BUILDS:
        assert flags(wheels.patched(release, patch=PATCH), release, capability, deep_gemm) == flags(
            pristine, release, capability, deep_gemm
        ), deep_gemm


@pytest.mark.parametrize("release", APPLIED)
def test_unpatched_capability_12_runs_deep_gemm_kernels_it_cannot_run(release: str) -> None:
    """The bug: DeepGEMM on, in its SM100 (tcgen05/TMEM) flavour where `is_blackwell()` counts
    major 12 (0.5.4.post2 - 0.5.12.post1), else in its SM90 (wgmma) flavour."""
    version = Version(release)
    pristine = wheels.member(release, configurer(version))
    enabled = {c: flags(pristine, release, c, "hopper-blackwell") for c in TWELVE}
    assert enabled[(12, 1)]["ENABLE_JIT_DEEPGEMM"]
    assert enabled[(12, 0)]["ENABLE_JIT_DEEPGEMM"] == (version < Version("0.5.13"))
    sm100_flavour = Version("0.5.4.post2") <= version < Version("0.5.13")
    for capability, result in enabled.items():
        if result["ENABLE_JIT_DEEPGEMM"]:
            assert result["DEEPGEMM_BLACKWELL"] == sm100_flavour, capability


def test_the_fixing_releases_themselves() -> None:
    """What the differential compares with: 0.5.13 turns 12.0 off and leaves 12.1 on; 0.5.21
    turns both off unless DeepGEMM has the SM120 kernels."""
    assert not upstream("0.5.13", (12, 0), "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
    assert not upstream("0.5.13", (12, 0), "sm120")["ENABLE_JIT_DEEPGEMM"]  # whatever is installed
    assert upstream("0.5.13", (12, 1), "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
    assert upstream("0.5.20", (12, 1), "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
    for capability in TWELVE:
        assert not upstream("0.5.21", capability, "hopper-blackwell")["ENABLE_JIT_DEEPGEMM"]
        assert upstream("0.5.21", capability, "sm120")["ENABLE_JIT_DEEPGEMM"]


def test_upstream_releases_are_left_alone() -> None:
    for release in ("0.5.21", "0.5.23"):
        wheels.assert_left_alone(PATCH, release)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
