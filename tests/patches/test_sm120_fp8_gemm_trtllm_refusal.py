"""sm120-fp8-gemm-trtllm-refusal on the real wheels: the release's own dispatcher, run.

Each release's fp8_utils.py (patched or not) is executed on a stand-in GPU with its own capability
probes (`tests/support/stand_ins_gemm.py`), as a server does: `initialize_fp8_gemm_config` with
`--fp8-gemm-backend flashinfer_trtllm`, then `dispatch_w8a8_block_fp8_linear()`, which calls
`_dispatch_explicit_backend`. Unpatched, 12.0 and 12.1 get FlashInfer's TRT-LLM block-FP8 linear,
a kernel the kernel-support table says does not run there; patched, they get 0.5.10's own
RuntimeError, word for word. 10.0 keeps the kernel and 8.9/9.0 are refused, both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_fp8_block_gemm_triton import Sm120Fp8BlockGemmTriton
from sglpatch.patches.sm120_fp8_gemm_trtllm_refusal import (
    FP8_UTILS,
    NEW_TAIL,
    Sm120Fp8GemmTrtllmRefusal,
)
from sglpatch.results import AlreadyApplied, Applied
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.stand_ins_gemm import Machine, fp8_linear_choice

pytestmark = pytest.mark.wheel

PATCH = Sm120Fp8GemmTrtllmRefusal()
TRITON_PATCH = Sm120Fp8BlockGemmTriton()  # `auto` on 12: the other FP8 GEMM patch, same file
FIRST, FIXED = "0.5.6.post2", "0.5.10"
AFFECTED = [r for r in wheels.RELEASES if Version(FIRST) <= Version(r) < Version(FIXED)]
UPSTREAM = [r for r in wheels.RELEASES if Version(r) >= Version(FIXED)]
BEFORE = [r for r in wheels.RELEASES if Version(r) < Version(FIRST)]
TWELVE = [(12, 0), (12, 1)]
REFUSED = [(8, 9), (9, 0)]
SM100 = (10, 0)
ASKED = "flashinfer_trtllm"
FLASHINFER = "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback"
TRITON = "triton_w8a8_block_fp8_linear"
KERNEL = ("gemm", support.gemm_name("fp8", ASKED))
NO_DEEP_GEMM = {"ENABLE_JIT_DEEPGEMM": False, "DEEPGEMM_BLACKWELL": False}
ENV_ASKS = (("SGLANG_ENABLE_FLASHINFER_FP8_GEMM", "1"),)  # the deprecated way to ask, on `auto`


def fp8_utils(release: str) -> str:
    path = FP8_UTILS.get(Version(release))
    assert path is not None
    return f"sglang/{path}"


@cache
def outcome(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    backend: str = ASKED,
    env: tuple[tuple[str, str], ...] = (),
) -> str:
    """The block-FP8 linear the release's code hands back, or `RuntimeError: <message>`."""
    machine = Machine(capability, env=env)
    try:
        return fp8_linear_choice(source, release, machine, NO_DEEP_GEMM, backend)
    except RuntimeError as error:
        return f"RuntimeError: {error}"


def pristine(release: str) -> bytes:
    return wheels.member(release, fp8_utils(release))


def refusal(capability: tuple[int, int]) -> str:
    """What 0.5.10's own code says when asked for the backend on `capability`."""
    return outcome(pristine(FIXED), FIXED, capability)


def test_the_table_says_the_kernel_runs_on_sm100_alone() -> None:
    for capability in TWELVE + REFUSED:
        assert support.runs_on(*KERNEL, capability) is False
    assert support.runs_on(*KERNEL, SM100) is True


@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_12_is_handed_the_sm100_only_kernel(release: str) -> None:
    for capability in TWELVE:
        assert outcome(pristine(release), release, capability) == FLASHINFER
        assert outcome(pristine(release), release, capability, "auto", ENV_ASKS) == FLASHINFER
        assert support.runs_on(*KERNEL, capability, release=release) is False


@pytest.mark.parametrize("release", AFFECTED)
def test_patched_12_is_refused_as_0_5_10_refuses(release: str) -> None:
    source = wheels.patched(release, patch=PATCH)
    for capability in TWELVE:
        refused = outcome(source, release, capability)
        assert refused.startswith("RuntimeError: ") and NEW_TAIL in refused
        assert "--fp8-gemm-backend=flashinfer_trtllm" in refused
        assert refused == refusal(capability)  # upstream parity, word for word
        assert outcome(source, release, capability, "auto", ENV_ASKS) == refused


@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_are_served_as_before(release: str) -> None:
    source = wheels.patched(release, patch=PATCH)
    assert outcome(source, release, SM100) == outcome(pristine(release), release, SM100)
    assert outcome(source, release, SM100) == FLASHINFER
    for capability in REFUSED:  # no Blackwell at all: refused both ways (the wording moves)
        assert outcome(source, release, capability).startswith("RuntimeError: ")
        assert outcome(pristine(release), release, capability).startswith("RuntimeError: ")


@pytest.mark.parametrize("release", AFFECTED)
def test_other_backends_on_12_are_untouched(release: str) -> None:
    """Only the flashinfer_trtllm arm changes: `auto`, `triton` and `cutlass` answer as before."""
    source = wheels.patched(release, patch=PATCH)
    for capability in TWELVE:
        for backend in ("auto", "triton", "cutlass"):
            before = outcome(pristine(release), release, capability, backend)
            assert outcome(source, release, capability, backend) == before


def test_0_5_10_on_12_and_on_sm100() -> None:
    for capability in TWELVE:
        assert refusal(capability).startswith("RuntimeError: ")
        assert NEW_TAIL in refusal(capability)
    assert outcome(pristine(FIXED), FIXED, SM100) == FLASHINFER


@pytest.mark.parametrize("release", AFFECTED)
def test_with_the_triton_patch_12_gets_triton_on_auto_and_the_refusal_when_asked(
    release: str,
) -> None:
    """The two FP8 GEMM patches share fp8_utils.py and compose, in either order."""
    version, path = Version(release), fp8_utils(release)
    results = []
    for order in ([PATCH, TRITON_PATCH], [TRITON_PATCH, PATCH]):
        change, outcomes = engine.transform_source(pristine(release), path, order, version)
        assert all(isinstance(o, Applied) for o in outcomes.values()) and change is not None
        results.append(change.after)
    assert results[0] == results[1]
    for capability in TWELVE:
        assert outcome(results[0], release, capability, "auto") == TRITON
        assert outcome(results[0], release, capability) == refusal(capability)
        assert outcome(results[0], release, capability, "auto", ENV_ASKS).startswith("Runtime")


@pytest.mark.parametrize("release", UPSTREAM)
def test_from_0_5_10_it_is_upstream(release: str) -> None:
    wheels.assert_left_alone(PATCH, release)


def test_before_0_5_6_post2_it_is_not_for_the_release() -> None:
    for release in BEFORE:
        assert PATCH.target_file(Version(release)) is None
        assert b"fp8_gemm_runner_backend" not in wheels.member(release, "sglang/srt/server_args.py")


def test_the_engine_reports_each_release() -> None:
    for release in (FIRST, "0.5.9"):
        change, outcomes = engine.transform_source(
            pristine(release), fp8_utils(release), [PATCH], Version(release)
        )
        assert isinstance(outcomes[PATCH.id], Applied) and change is not None
    _, outcomes = engine.transform_source(
        pristine("0.5.23"), fp8_utils("0.5.23"), [PATCH], Version("0.5.23")
    )
    assert isinstance(outcomes[PATCH.id], AlreadyApplied) and outcomes[PATCH.id].by == "upstream"


def matrix_expected(release: Version) -> str:
    if release < Version(FIRST):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine_members: Mapping[str, bytes]) -> None:
    """Unpatched, 12.0 asking for flashinfer_trtllm is handed the SM100-only kernel."""
    name = str(release)
    assert outcome(pristine_members[fp8_utils(name)], name, (12, 0)) == FLASHINFER


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[fp8_utils(name)]
    for capability in TWELVE:
        refused = outcome(source, name, capability)
        assert refused.startswith("RuntimeError: ") and NEW_TAIL in refused
    assert outcome(source, name, SM100) == FLASHINFER


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
