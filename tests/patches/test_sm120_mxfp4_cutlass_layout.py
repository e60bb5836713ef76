"""sm120-mxfp4-cutlass-layout on the real wheels: SM120 CUTLASS MXFP4 MoE keeps GPT-OSS's layout.

No release fixes this, so the proof is the releases' own code, patched and unpatched, on stand-in
devices whose capability predicates are the release's own (`tests.support.stand_ins_moe`):

- `Mxfp4MoEMethod.__init__` (which FlashInfer kernel `flashinfer_mxfp4` becomes on each GPU) and
  `create_moe_runner` (where the patch refuses), compiled from the wheel, with the release's own
  `MoeRunnerBackend` and `MoeRunnerConfig`, for each expert layout a model hands FusedMoE;
- `_process_weights_for_sm120_cutlass` itself, run on tensors of labels (pure-Python stand-ins
  for the slicing it does; FlashInfer's scale swizzle is the identity here): which checkpoint
  rows land in the `[up; gate]` halves the kernel reads, and the SwiGLU constants it sets;
- what the layouts are (read off `models/gpt_oss.py`, `models/kimi_k3.py`, FusedMoE), what
  Marlin does with each (its own de-interleave test), and what `auto` resolves to on 12 for
  MXFP4 MoE models (`tests.support.census`, the whole start-up resolution).

Nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_mxfp4_cutlass_layout import Sm120Mxfp4CutlassLayout
from tests.support import census, syntax, wheels
from tests.support import stand_ins_moe as stand_ins
from tests.support.matrix import MatrixHooks
from tests.support.stand_ins_mxfp4 import (
    CLASS,
    FIRST,
    GATE,
    GPT_OSS,
    KIMI_K3,
    LAYOUTS,
    MXFP4,
    OTHERS,
    PLAIN_SILU,
    RELEASES,
    UP,
    Built,
    Layout,
    build,
    prepare,
)

pytestmark = pytest.mark.wheel

PATCH = Sm120Mxfp4CutlassLayout()
BACKENDS = ["flashinfer_mxfp4", "marlin", "auto", "triton_kernel", "triton"]
REFUSAL = "pass --moe-runner-backend marlin"


# --- the proofs ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", OTHERS, ids=str)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_unpatched_capability_12_runs_another_layout_as_gpt_oss(
    release: str, capability: tuple[int, int], layout: Layout
) -> None:
    """The symptom: with flashinfer_mxfp4 the layer is built for the SM120 CUTLASS kernel, no
    error, and the preparation reads the rows and the SwiGLU as GPT-OSS's (and the runner runs
    SwiGLU whatever the activation: test_the_sm120_runner_runs_swiglu_whatever_the_layer)."""
    pristine = wheels.member(release, MXFP4)
    built = build(pristine, release, capability, "flashinfer_mxfp4", layout)
    assert built == Built("cutlass_sm120", "flashinfer_mxfp4", None)
    prepared = prepare(pristine, release, layout)
    wrong_rows = prepared.first_half != UP or prepared.second_half != GATE
    wrong_swiglu = (prepared.alpha, prepared.limit) != (
        {layout.gemm1_alpha},
        {layout.gemm1_clamp_limit},
    )
    assert wrong_rows or wrong_swiglu or layout.activation != "silu"
    assert (prepared.alpha, prepared.beta, prepared.limit) == ({1.702}, {1.0}, {7.0})
    if layout.gemm1_alpha is None or not layout.gate_up_interleaved:  # w1/w3 as two halves
        assert set(prepared.first_half) & set(GATE)  # gate rows where FlashInfer reads up
        assert set(prepared.bias_halves[0]) & set(GATE)
        assert set(prepared.scale_halves[0]) & set(GATE)


@pytest.mark.parametrize("release", RELEASES)
def test_gpt_oss_rows_and_swiglu_are_what_the_preparation_was_written_for(release: str) -> None:
    """For GPT-OSS the preparation is right: up rows first, gate rows second, its constants."""
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        prepared = prepare(source, release, GPT_OSS)
        assert (prepared.first_half, prepared.second_half) == (UP, GATE)
        assert prepared.bias_halves == (UP, GATE) and prepared.scale_halves == (UP, GATE)
        assert (prepared.alpha, prepared.beta, prepared.limit) == ({1.702}, {1.0}, {7.0})


@pytest.mark.parametrize("layout", OTHERS, ids=str)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_refuses_another_layout_naming_marlin(
    release: str, capability: tuple[int, int], layout: Layout
) -> None:
    built = build(
        wheels.patched(release, patch=PATCH), release, capability, "flashinfer_mxfp4", layout
    )
    assert built.kernel == "cutlass_sm120" and built.runner is None
    assert built.error is not None and built.error.startswith("ValueError: ")
    assert built.error.endswith(REFUSAL) and "\n" not in built.error
    # The backend it names builds the same layer on the same device, unpatched and patched.
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        assert build(source, release, capability, "marlin", layout) == Built(None, "marlin", None)
    assert support.runs_on("moe", "marlin", capability, release=release) is True


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_keeps_gpt_oss_on_the_cutlass_kernel(
    release: str, capability: tuple[int, int]
) -> None:
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        built = build(source, release, capability, "flashinfer_mxfp4", GPT_OSS)
        assert built == Built("cutlass_sm120", "flashinfer_mxfp4", None)


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_with_another_backend_builds_what_it_built(
    release: str, capability: tuple[int, int]
) -> None:
    for backend in BACKENDS[1:]:
        for layout in LAYOUTS:
            ours = build(wheels.patched(release, patch=PATCH), release, capability, backend, layout)
            theirs = build(wheels.member(release, MXFP4), release, capability, backend, layout)
            assert ours == theirs and ours.error is None, (backend, layout)


@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_other_capabilities_build_exactly_what_they_built(
    release: str, capability: tuple[int, int]
) -> None:
    seen: set[Built] = set()
    for backend in BACKENDS:
        for layout in LAYOUTS:
            ours = build(wheels.patched(release, patch=PATCH), release, capability, backend, layout)
            theirs = build(wheels.member(release, MXFP4), release, capability, backend, layout)
            assert ours == theirs, (backend, layout)
            seen.add(ours)
    kernels = {b.kernel for b in seen}
    # Each device takes its own FlashInfer kernel (8.9 refuses flashinfer_mxfp4 in __init__).
    assert (
        kernels
        == {(8, 9): {None}, (9, 0): {None, "cutlass_sm90"}, (10, 0): {None, "trtllm_sm100"}}[
            capability
        ]
    )


def _prepared_before_sm120(source: bytes, attribute: str) -> bool:
    """Whether process_weights_after_loading returns in a `... or self.<attribute>` branch
    before it reaches the `_fi_kernel == "cutlass_sm120"` one."""
    tree = syntax.tree(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS]
    (method,) = [
        n
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name == "process_weights_after_loading"
    ]
    tests = [ast.unparse(s.test) if isinstance(s, ast.If) else "" for s in method.body]
    sm120 = next(i for i, t in enumerate(tests) if "'cutlass_sm120'" in t)
    taken = [
        i
        for i, (t, s) in enumerate(zip(tests, method.body, strict=True))
        if f"self.{attribute}" in t
        and f"not self.{attribute}" not in t
        and isinstance(s, ast.If)
        and isinstance(s.body[-1], ast.Return)
    ]
    return bool(taken) and taken[0] < sm120


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_megamoe_is_refused_only_where_it_reaches_the_sm120_preparation(
    release: str, capability: tuple[int, int]
) -> None:
    """From 0.5.18 `--moe-a2a-backend megamoe` prepares the experts for DeepGEMM and returns
    before the SM120 preparation: the patch leaves it as it was. 0.5.17 has no such branch
    (its DeepGEMM one asks for the deep_gemm runner), so there the refusal stands."""
    pristine = wheels.member(release, MXFP4)
    skips = _prepared_before_sm120(pristine, "use_mega_moe")
    assert skips == (Version(release) >= Version("0.5.18"))
    for layout in LAYOUTS:
        ours = build(
            wheels.patched(release, patch=PATCH),
            release,
            capability,
            "flashinfer_mxfp4",
            layout,
            True,
        )
        theirs = build(pristine, release, capability, "flashinfer_mxfp4", layout, True)
        if skips or layout == GPT_OSS:
            assert ours == theirs and ours.error is None, layout
        else:
            assert (ours.error or "").endswith(REFUSAL), layout


MOE_MODELS = ["Qwen3MoeForCausalLM", "KimiK3ForConditionalGeneration", "MiniMaxM3ForCausalLM"]


@cache
def _start_up(release: str, capability: tuple[int, int]) -> census.Release:
    return census.Release(release, capability)


@pytest.mark.parametrize("release", ["0.5.17", "0.5.19", "0.5.23"])
def test_auto_gives_flashinfer_mxfp4_on_12_to_gpt_oss_only(release: str) -> None:
    """Why the refusal names a flag: left on `auto`, an MXFP4 checkpoint reaches the SM120
    CUTLASS path on 12 only as GPT-OSS; other MoE models stay on `auto` (Triton)."""
    for capability in stand_ins.SM120:
        device = _start_up(release, capability)
        outcome = device.evaluate("GptOssForCausalLM", "mxfp4")
        assert {f: v for _, f, v in outcome.choices}["moe_runner_backend"] == "flashinfer_mxfp4"
        for arch in MOE_MODELS:
            outcome = device.evaluate(arch, "mxfp4")
            assert outcome.not_evaluated is None and outcome.refused is None, arch
            chosen = {f: v for _, f, v in outcome.choices}.get("moe_runner_backend", "auto")
            assert chosen == "auto", (arch, chosen)


@pytest.mark.parametrize("release", [r for r in wheels.RELEASES if Version(r) < Version(FIRST)])
def test_before_0_5_17_there_is_no_sm120_cutlass_path(release: str) -> None:
    assert PATCH.target_file(Version(release)) is None


def test_0_5_16_has_no_sm120_preparation() -> None:
    assert b"_process_weights_for_sm120_cutlass" not in wheels.member("0.5.16", MXFP4)
    assert b"_process_weights_for_sm120_cutlass" in wheels.member(FIRST, MXFP4)


# --- tests/test_matrix.py --------------------------------------------------------------------


def matrix_expected(release: Version) -> str:
    return "applied" if release >= Version(FIRST) else "not for this release"


def _on_12(release: Version, members: Mapping[str, bytes]) -> list[Built]:
    name = str(release)
    source = members.get(MXFP4, wheels.member(name, MXFP4))
    return [
        build(source, name, capability, "flashinfer_mxfp4", layout)
        for capability in stand_ins.SM120
        for layout in (GPT_OSS, KIMI_K3, PLAIN_SILU)
    ]


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, Kimi K3's and a plain-SiLU layout are built for the SM120 CUTLASS kernel."""
    built = _on_12(release, pristine)
    if any(b != Built("cutlass_sm120", "flashinfer_mxfp4", None) for b in built):
        raise AssertionError(f"{release}: flashinfer_mxfp4 on 12 -> {built}")


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Applied, GPT-OSS keeps the kernel; the other two are refused naming marlin."""
    built = _on_12(release, patched)
    for i, b in enumerate(built):
        if i % 3 == 0:
            ok = b == Built("cutlass_sm120", "flashinfer_mxfp4", None)
        else:
            ok = b.runner is None and (b.error or "").endswith(REFUSAL)
        if not ok:
            raise AssertionError(f"{release}: flashinfer_mxfp4 on 12 -> {built}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
