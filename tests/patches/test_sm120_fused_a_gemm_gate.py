"""sm120-fused-a-gemm-gate, proven against upstream's own gate (0.5.4.post2) on the real wheels.

The right-hand side of `self.use_min_latency_fused_a_gemm = (...)` is evaluated from the wheel's
(patched) source for a DeepSeek-V3-shaped bf16 projection on a stand-in GPU.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import cache
from types import CodeType, SimpleNamespace

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.sm120_fused_a_gemm_gate import CLASS, FLAG, Sm120FusedAGemmGate
from sglpatch.results import AlreadyApplied
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120FusedAGemmGate()
MODEL = "sglang/srt/models/deepseek_v2.py"
FIXED = "0.5.4.post2"
APPLIED = ["0.5.3", "0.5.4", "0.5.4.post1"]
BF16 = object()  # torch.bfloat16 stand-in


@cache
def _gate(source: bytes) -> CodeType:
    tree = syntax.tree(source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    init = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    value = next(
        node.value
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Attribute)
        and node.targets[0].attr == FLAG
    )
    return compile(ast.Expression(value), MODEL, "eval")


def fused_a_gemm(
    source: bytes, sm: int, dtype: object = BF16, shape: tuple[int, int] = (2112, 7168)
) -> bool:
    """Whether the attention layer would take the fused_a_gemm kernel."""
    weight = SimpleNamespace(dtype=dtype, shape=shape)
    names = {
        # 0.5.10 moved the two flags onto self; both spellings get the same answer.
        "self": SimpleNamespace(
            fused_qkv_a_proj_with_mqa=SimpleNamespace(weight=weight),
            has_fused_proj=True,
            is_packed_weight=False,
        ),
        "torch": SimpleNamespace(bfloat16=BF16),
        "has_fused_proj": True,
        "is_packed_weight": False,
        "_is_cuda": True,
        "_device_sm": sm,
    }
    return bool(eval(_gate(source), names))


@pytest.mark.parametrize("release", APPLIED)
def test_unpatched_capability_12_takes_the_kernel(release: str) -> None:
    assert fused_a_gemm(wheels.member(release, MODEL), 120) is True


@pytest.mark.parametrize("sm", [120, 121])
@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_is_kept_off_like_the_fixing_release(release: str, sm: int) -> None:
    ours, upstream = wheels.patched(release, patch=PATCH), wheels.member(FIXED, MODEL)
    assert fused_a_gemm(ours, sm) is fused_a_gemm(upstream, sm) is False


@pytest.mark.parametrize("sm", [89, 90, 100, 103])
@pytest.mark.parametrize("release", APPLIED)
def test_other_capabilities_keep_their_answer(release: str, sm: int) -> None:
    ours = wheels.patched(release, patch=PATCH)
    for dtype, shape in [(BF16, (2112, 7168)), (object(), (2112, 7168)), (BF16, (1536, 7168))]:
        expected = fused_a_gemm(wheels.member(release, MODEL), sm, dtype, shape)
        assert fused_a_gemm(ours, sm, dtype, shape) is expected
        assert fused_a_gemm(wheels.member(FIXED, MODEL), sm, dtype, shape) is expected


@pytest.mark.parametrize("release", [FIXED, "0.5.9", "0.5.14"])
def test_from_0_5_4_post2_the_gate_is_upstream(release: str) -> None:
    change, outcomes = engine.transform_source(
        wheels.member(release, MODEL), MODEL, [PATCH], Version(release)
    )
    assert change is None
    assert isinstance(outcomes[PATCH.id], AlreadyApplied) and outcomes[PATCH.id].by == "upstream"


def test_from_0_5_15_the_gate_is_gone_and_so_is_the_patch() -> None:
    # fused_a_gemm has an SM120 (CuTe DSL) path there; the attention gate no longer bounds sm.
    assert b"90 <= _device_sm < 120" not in wheels.member("0.5.15", MODEL)
    assert PATCH.target_file(Version("0.5.15")) is None


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release >= Version("0.5.15"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On SM 120 and 121 the DeepSeek attention does not take fused_a_gemm; on SM 90 it does."""
    if matrix_expected(release) == "not for this release":
        return
    source = patched.get(MODEL, wheels.member(str(release), MODEL))
    for sm, taken in [(120, False), (121, False), (90, True), (100, True)]:
        if fused_a_gemm(source, sm) is not taken:
            raise AssertionError(f"{release}: fused_a_gemm at SM {sm}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
