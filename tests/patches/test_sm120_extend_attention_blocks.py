"""sm120-extend-attention-blocks: 0.5.9's capability-12 block sizes, on every earlier release.

The differential proof runs each patched release's own block-size choice and 0.5.9's under the
same stand-in capability; the compile proof builds the release's own extend kernel for sm_120 with
the sizes its launcher picks and reads the shared memory the launch asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_extend_attention_blocks import Sm120ExtendAttentionBlocks
from tests.support import stand_ins_triton as triton_run
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120ExtendAttentionBlocks()
FIXED = "0.5.9"
APPLIED = [r for r in wheels.RELEASES if Version(r) < Version(FIXED)]
# (Lq, Lv): head sizes 64 to 256, DeepSeek's 192/128, and the MLA path of Kimi K2 and DeepSeek.
SHAPES = ((64, 64), (128, 128), (192, 128), (256, 256), (288, 256), (576, 512))
# Where Hopper's sizes, which capability 12 got before 0.5.9, overflow sm_120's shared memory.
OVERFLOWING = ((256, 256), (576, 512))
COMPILED_SHAPES = ((128, 128), (192, 128), (256, 256), (576, 512))
MLA = (576, 512)
LIMIT = triton_run.SM120_SHARED_MEMORY


def path(release: Version) -> str:
    target = PATCH.target_file(release)
    assert target is not None
    return f"sglang/{target}"


@cache
def pristine(release: str) -> bytes:
    return wheels.member(release, path(Version(release)))


def fixed_choice(capability: tuple[int, int], lq: int, lv: int) -> tuple[object, ...]:
    return triton_run.extend_choice(pristine(FIXED), capability, lq, lv)


def matrix_expected(release: Version) -> str:
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine_files: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 takes Hopper's sizes, not the ones 0.5.9 chose for it."""
    source = pristine_files[path(release)]
    for capability in triton_run.CAPABILITY_12:
        for lq, lv in OVERFLOWING:
            chosen = triton_run.extend_choice(source, capability, lq, lv)
            assert chosen == triton_run.extend_choice(source, (9, 0), lq, lv)
            assert chosen != fixed_choice(capability, lq, lv)


def matrix_effect(release: Version, patched_files: Mapping[str, bytes]) -> None:
    """Capability 12 chooses what 0.5.9 chooses; on a patched release nothing else changes."""
    source = patched_files[path(release)]
    for capability in triton_run.CAPABILITY_12:
        for lq, lv in SHAPES:
            chosen = triton_run.extend_choice(source, capability, lq, lv)
            assert chosen == fixed_choice(capability, lq, lv), (capability, lq, lv)
    if release >= Version(FIXED):
        return
    before = pristine(str(release))
    for capability in triton_run.OTHER_CAPABILITIES:
        for lq, lv in SHAPES:
            assert triton_run.extend_choice(source, capability, lq, lv) == (
                triton_run.extend_choice(before, capability, lq, lv)
            ), (capability, lq, lv)


@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_chooses_what_0_5_9_chooses(release: str) -> None:
    matrix_symptom(Version(release), {path(Version(release)): pristine(release)})
    matrix_effect(Version(release), {path(Version(release)): wheels.patched(release, patch=PATCH)})


def test_releases_from_0_5_9_are_left_alone() -> None:
    for release in wheels.RELEASES[len(APPLIED) :]:
        wheels.assert_left_alone(PATCH, release)


def _launch(source: bytes, lq: int, lv: int) -> triton_run.Compiled:
    kernel, call = triton_run.launch(
        source, (12, 0), "extend_attention_fwd", triton_run.extend_args(lq, lv)
    )
    # The whole module's launcher agrees with the cut-out choice the matrix relies on.
    chosen = tuple(call.kwargs[name] for name in triton_run.EXTEND_CHOICE)
    assert chosen == triton_run.extend_choice(source, (12, 0), lq, lv)
    return triton_run.shared_memory(kernel, call)


@pytest.mark.parametrize("shape", COMPILED_SHAPES, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("release", [*APPLIED, FIXED])
def test_the_kernel_fits_sm120_shared_memory_only_when_patched(
    release: str, shape: tuple[int, int]
) -> None:
    """Compile the release's own kernel for sm_120 with its launcher's sizes at capability 12."""
    lq, lv = shape
    if release == FIXED:
        assert _launch(pristine(release), lq, lv).shared <= LIMIT
        return
    after = _launch(wheels.patched(release, patch=PATCH), lq, lv)
    assert after.shared <= LIMIT
    assert (after.constexprs["BLOCK_M"], after.constexprs["BLOCK_N"]) == (
        fixed_choice((12, 0), lq, lv)[3:5]
    )
    if shape in OVERFLOWING:
        assert _launch(pristine(release), lq, lv).shared > LIMIT


@pytest.mark.parametrize("release", [r for r in APPLIED if Version(r) >= Version("0.5.4")])
def test_the_deterministic_launcher_shares_the_fix(release: str) -> None:
    """From 0.5.4 `extend_attention_fwd_unified` takes its sizes from the same chooser."""
    for source, fits in ((pristine(release), False), (wheels.patched(release, patch=PATCH), True)):
        kernel, call = triton_run.launch(
            source,
            (12, 0),
            "extend_attention_fwd_unified",
            triton_run.unified_args(*MLA),
            "_fwd_kernel_unified",
        )
        assert (triton_run.shared_memory(kernel, call).shared <= LIMIT) == fits


def test_the_published_crash_figures() -> None:
    """0.5.8 on Kimi K2: 'Required: 106496, Hardware limit: 101376'; 0.5.9's sizes need 71680."""
    assert _launch(pristine("0.5.8"), *MLA).shared == 106496
    assert _launch(pristine(FIXED), *MLA).shared == 71680
    assert _launch(wheels.patched("0.5.8", patch=PATCH), *MLA).shared == 71680


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
