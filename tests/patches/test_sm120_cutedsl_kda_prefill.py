"""sm120-cutedsl-kda-prefill, proven against upstream's own gate (0.5.23) on the real wheels."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_cutedsl_gdn_prefill import OURS, UPSTREAM
from sglpatch.patches.sm120_cutedsl_kda_prefill import Sm120CutedslKdaPrefill
from tests.patches.test_sm120_cutedsl_gdn_prefill import gate
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120CutedslKdaPrefill()
KERNEL = "sglang/srt/layers/attention/linear/kernels/kda_cutedsl.py"
FIXED = "0.5.23"
APPLIED = ["0.5.14", "0.5.17", "0.5.22"]


@pytest.mark.parametrize("release", APPLIED)
def test_the_gate_decides_whether_the_kernel_serves_prefill(release: str) -> None:
    source = wheels.member(release, KERNEL)
    assert f"self.supports_prefill = {OURS}()".encode() in source
    assert gate(source, OURS)((12, 0)) is True  # unpatched: capability 12 takes the kernel


@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_is_kept_off_like_the_fixing_release(
    release: str, capability: tuple[int, int]
) -> None:
    ours = gate(wheels.patched(release, patch=PATCH), OURS)(capability)
    assert ours == gate(wheels.member(FIXED, KERNEL), UPSTREAM)(capability) is False


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (10, 3)])
@pytest.mark.parametrize("release", APPLIED)
def test_other_capabilities_keep_their_answer(release: str, capability: tuple[int, int]) -> None:
    ours = gate(wheels.patched(release, patch=PATCH), OURS)(capability)
    assert ours == gate(wheels.member(release, KERNEL), OURS)(capability)
    assert ours == gate(wheels.member(FIXED, KERNEL), UPSTREAM)(capability)


def test_0_5_23_is_left_alone_and_0_5_13_has_no_gate() -> None:
    wheels.assert_left_alone(PATCH, FIXED)
    assert b"supports_prefill" not in wheels.member("0.5.13", KERNEL)
    assert PATCH.target_file(Version("0.5.13")) is None


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release < Version("0.5.14"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On capability 12.0 and 12.1 the CuTe DSL KDA prefill gate says no; on 10.0 yes."""
    if matrix_expected(release) == "not for this release":
        return
    source = patched.get(KERNEL, wheels.member(str(release), KERNEL))
    name = OURS if release < Version(FIXED) else UPSTREAM
    for capability, admitted in [((12, 0), False), ((12, 1), False), ((10, 0), True)]:
        if gate(source, name)(capability) is not admitted:
            raise AssertionError(f"{release}: CuTe DSL KDA prefill gate at {capability}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
