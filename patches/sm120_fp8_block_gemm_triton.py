"""Send capability 12's automatic FP8 block-GEMM backend to Triton, as upstream does from 0.5.10.

Why: from 0.5.6.post2 `fp8_utils.py` picks the block-FP8 linear kernel itself when
`--fp8-gemm-backend` is `auto` (the default): DeepGEMM if enabled, else FlashInfer's groupwise GEMM
with `backend="trtllm"` whenever `is_blackwell_supported()` (which counts major 12 as Blackwell)
and FlashInfer is installed (an SGLang dependency), else CUTLASS. On capability 12 (RTX PRO 6000,
RTX 5090, GB10) the first is SM90/SM100-only (see `sm120-deep-gemm-off`) and the second is
SM100-only: upstream's own 0.5.10 note reads "SM120/121: CUTLASS only. SM100/103: TRTLLM only."

Upstream: 0.5.10's `initialize_fp8_gemm_config` turns `auto` into `triton` when
`is_sm120_supported()` (major 12, CUDA >= 12.8): 12.0 and 12.1 alike, ahead of DeepGEMM and
FlashInfer ("Verify if CUTLASS can be set by default once SwapAB is supported"). 0.5.16 switched it
to `cutlass`, together with newer CUTLASS/sgl-kernel SM120 work; 0.5.10's choice is the one that
needs nothing the old release lacks. This patch inserts 0.5.10's branch right before the function
stores the backend, after the (deprecated) `SGLANG_ENABLE_FLASHINFER_FP8_GEMM` /
`SGLANG_SUPPORT_CUTLASS_BLOCK_FP8` overrides, which stay explicit choices like
`--fp8-gemm-backend`, and adds `is_sm120_supported` to the `sglang.srt.utils` import.

What the user gets instead: on capability 12 with `--fp8-gemm-backend auto`, block-FP8 linear
layers run Triton's `w8a8_block_fp8_matmul` (`triton_w8a8_block_fp8_linear`), and
`dispatch_w8a8_block_fp8_linear` no longer calls `_dispatch_auto_backend`, whose choice it was
(doctor counts that function's decisions as covered: `unreached_on_12`). An explicit
`--fp8-gemm-backend` is obeyed as before; other capabilities are untouched. Releases before
0.5.6.post2 have no automatic choice (FlashInfer and CUTLASS are opt-in there): not for them.

Delete when: the oldest release in use is 0.5.10 or newer.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AnchorMissing,
    ByRelease,
    Concerns,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

FUNCTION = "initialize_fp8_gemm_config"
STORED = "FP8_GEMM_RUNNER_BACKEND"
PROBE = "is_sm120_supported"
UTILS = "sglang.srt.utils"

# 0.5.6.post2 introduced `initialize_fp8_gemm_config` and the automatic choice.
FP8_UTILS = ByRelease({">=0.5.6.post2": "srt/layers/quantization/fp8_utils.py"})

# 0.5.10's branch.
BRANCH = """\
if backend == "auto" and is_sm120_supported():
    # SM120/SM121: DeepGEMM and FlashInfer's TRT-LLM GEMM are SM90/SM100-only kernels
    # (upstream 0.5.10 chooses Triton here too)
    backend = "triton"
"""


def _mentions_sm120(node: cst.CSTNode) -> bool:
    """`is_sm120_supported()` or `get_platform().is_sm120` (0.5.19+)."""
    return any(n.value == PROBE for n in cst_tools.walk(node, cst.Name)) or any(
        a.attr.value == "is_sm120" for a in cst_tools.walk(node, cst.Attribute)
    )


def _is_auto_test(node: cst.BaseExpression) -> bool:
    """`backend == "auto"`."""
    return (
        isinstance(node, cst.Comparison)
        and isinstance(node.left, cst.Name)
        and node.left.value == "backend"
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.Equal)
        and isinstance(node.comparisons[0].comparator, cst.SimpleString)
        and node.comparisons[0].comparator.evaluated_value == "auto"
    )


def _sm120_branches(function: cst.FunctionDef) -> list[cst.If]:
    """`if backend == "auto" and <capability 12>:` at the top of the function."""
    return [
        statement
        for statement in cst_tools.function_body(function)
        if isinstance(statement, cst.If)
        and isinstance(statement.test, cst.BooleanOperation)
        and isinstance(statement.test.operator, cst.And)
        and _is_auto_test(statement.test.left)
        and _mentions_sm120(statement.test.right)
    ]


def _store(function: cst.FunctionDef) -> cst.SimpleStatementLine:
    """`FP8_GEMM_RUNNER_BACKEND = Fp8GemmRunnerBackend(backend)`: where the choice is kept."""
    stores = [
        statement
        for statement in cst_tools.function_body(function)
        if isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign)
        and any(
            isinstance(t.target, cst.Name) and t.target.value == STORED
            for t in statement.body[0].targets
        )
    ]
    if len(stores) != 1:
        raise AnchorMissing(f"{FUNCTION} assigns {STORED} {len(stores)} times, expected once")
    return stores[0]


class Sm120Fp8BlockGemmTriton(Patch):
    """`--fp8-gemm-backend auto` on capability 12 means Triton (0.5.10's choice)."""

    id = "sm120-fp8-block-gemm-triton"
    description = "automatic FP8 block-GEMM backend on capability 12 is Triton (0.5.10's choice)"
    symptom = (
        "FP8 block-quantized linears are sent to FlashInfer's SM100-only TRT-LLM GEMM (or "
        "DeepGEMM), which sm_120/sm_121 cannot run"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = FP8_UTILS
    concerns = Concerns(quantization=("fp8",))
    reads = (FUNCTION,)
    # `auto` never reaches the dispatcher on 12 (tests/patches/test_sm120_fp8_block_gemm_triton.py)
    unreached_on_12 = ("_dispatch_auto_backend",)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = cst_tools.find_function(module, FUNCTION)
        if _sm120_branches(function):
            raise AlreadyPresent(f"{FUNCTION} already chooses a backend for capability 12")
        store = _store(function)
        branch = cst_tools.statement(BRANCH, module)
        # Set off from the override block above it, as upstream's branch is from the store.
        blank = tuple(line for line in store.leading_lines if line.comment is None)
        branch = branch.with_changes(leading_lines=blank)
        new = cst_tools.with_statements_beside(function, store, [branch], after=False)
        module = cst_tools.replace(module, function, new)
        return cst_tools.with_imported_name(
            module, UTILS, PROBE, after=("is_sm90_supported", "is_sm100_supported")
        )

    def postcondition(self, module: cst.Module, release: Version) -> None:
        function = cst_tools.find_function(module, FUNCTION)
        if not _sm120_branches(function):
            raise PostconditionFailed(f"{FUNCTION} has no branch for capability 12")
        uses_probe = any(n.value == PROBE for n in cst_tools.walk(function, cst.Name))
        if uses_probe and PROBE not in cst_tools.imported_names(module, UTILS):
            raise PostconditionFailed(f"{PROBE} is called but not imported from {UTILS}")
