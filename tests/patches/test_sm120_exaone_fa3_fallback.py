"""sm120-exaone-fa3-fallback on the real wheels: the release's own EXAONE choice, on stand-ins.

As for Olmo2 (whose choice runner this reuses): unpatched, capability 12 gets `fa3`, whose own
start-up assertion refuses 12; patched, it gets `triton`, one of the backends the release accepts
for EXAONE and one the kernel-support table says runs on 12; 8.9, 9.0 and 10.0 are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_exaone_fa3_fallback import Sm120ExaoneFa3Fallback
from tests.patches.test_sm120_olmo_fa3_fallback import choice, fa3_starts, path
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120ExaoneFa3Fallback()
FIRST = "0.5.22"  # the release whose override started choosing a backend
AFFECTED = stand_ins.releases(FIRST, wheels.RELEASES[-1])
HOOK = "sglang/srt/arg_groups/model_hook.py"
BEFORE = {(8, 9): "fa3", (9, 0): "fa3", (10, 0): "trtllm_mha", (12, 0): "fa3", (12, 1): "fa3"}


@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_capability_12_gets_fa3_which_refuses_to_start_there(release: str) -> None:
    pristine = wheels.member(release, path(release, PATCH))
    for capability in stand_ins.CAPABILITIES:
        assert choice(pristine, release, capability, PATCH) == BEFORE[capability], capability
    for capability in stand_ins.SM120:
        assert not fa3_starts(release, capability)


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", AFFECTED)
def test_patched_capability_12_gets_triton_which_runs_there(
    release: str, capability: tuple[int, int]
) -> None:
    backend = choice(wheels.patched(release, patch=PATCH), release, capability, PATCH)
    assert backend == "triton" and support.runs_on("attention", backend, capability) is True
    # The release's own check on EXAONE with a sliding window accepts it.
    assert '["fa3", "triton", "trtllm_mha"]' in wheels.member(release, HOOK).decode()


@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_choose_exactly_what_they_chose(release: str) -> None:
    pristine = wheels.member(release, path(release, PATCH))
    for capability in stand_ins.OTHERS:
        assert choice(wheels.patched(release, patch=PATCH), release, capability, PATCH) == choice(
            pristine, release, capability, PATCH
        )


@pytest.mark.parametrize("requested", ["fa3", "triton", "trtllm_mha"])
def test_a_backend_the_user_chose_is_kept(requested: str) -> None:
    source = wheels.patched("0.5.23", patch=PATCH)
    for capability in stand_ins.SM120:
        assert choice(source, "0.5.23", capability, PATCH, requested=requested) == requested


def test_before_0_5_22_the_override_chose_no_backend() -> None:
    assert PATCH.target_file(Version("0.5.21")) is None
    override = wheels.member("0.5.21", "sglang/srt/arg_groups/model_overrides/exaone.py")
    assert b"attention_backend" not in override


def matrix_expected(release: Version) -> str:
    return "not for this release" if release < Version(FIRST) else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 gets fa3, which the kernel-support table says cannot run there."""
    name = str(release)
    for capability in stand_ins.SM120:
        backend = choice(pristine[path(name, PATCH)], name, capability, PATCH)
        assert backend == "fa3" and not support.runs_on("attention", backend, capability)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name, PATCH)]
    for capability in stand_ins.SM120:
        backend = choice(source, name, capability, PATCH)
        assert backend == "triton" and support.runs_on("attention", backend, capability)
    pristine = wheels.member(name, path(name, PATCH))
    for capability in stand_ins.OTHERS:
        assert choice(source, name, capability, PATCH) == choice(pristine, name, capability, PATCH)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
