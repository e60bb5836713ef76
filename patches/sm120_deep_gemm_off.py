"""Keep DeepGEMM off on compute capability 12.0 and 12.1, as upstream does from 0.5.13 / 0.5.21.

Why: `deep_gemm_wrapper/configurer.py` switches DeepGEMM on for every capability from 9.0 up when
the `deep_gemm` package imports. The DeepGEMM builds these releases run with have SM90 (wgmma) and
SM100 (tcgen05/TMEM) kernels only; sm_120/sm_121 (RTX PRO 6000, RTX 5090, GB10) have neither. So
on capability 12 the block-FP8 linear layers and DeepGEMM MoE paths are sent to kernels the GPU
cannot run: the SM100 flavour (`DEEPGEMM_BLACKWELL`, UE8M0 scales) from 0.5.4.post2, whose
`is_blackwell()` counts major 12 as Blackwell, and the SM90 flavour on 0.5.3-0.5.4.post1 and on
12.1 from 0.5.13.

Upstream: 0.5.13 returns False for `sm_version == 120` ("DeepGEMM requires TMEM/tcgen05
(SM100+datacenter), not available on SM120"); 12.1 (GB10) kept DeepGEMM on through 0.5.20.
0.5.20 re-enables 12.0 when the installed DeepGEMM has the SM120 entry point (DeepGEMM#324), and
0.5.21 widens both of its SM120 checks to `sm_version in (120, 121)` and probes three SM120 APIs:
with a DeepGEMM lacking the SM120 kernels, 12.0 and 12.1 are off; with one that has them, on.

What this patch does, release by release (the first fixing release's rule, for that release):
- 0.5.3 - 0.5.12.post1 (no capability-12 check): inserts 0.5.13's branch right after the
  `sm_version < 90` gate, for 0.5.21's set of capabilities: `if sm_version in (120, 121): return
  False`. Unconditional, as 0.5.13's is: these releases have none of the SM120 DeepGEMM code that
  0.5.20+ enables with a newer DeepGEMM.
- 0.5.13 - 0.5.20: widens every `sm_version == 120` / `get_device_sm() == 120` of the configurer
  to `in (120, 121)`, as 0.5.21 did: 12.1 gets exactly 12.0's treatment of that release (off on
  0.5.13-0.5.19; on 0.5.20 off unless the DeepGEMM SM120 entry point imports, then UE8M0 scales).
- 0.5.21+: already upstream.

What the user gets instead: `ENABLE_JIT_DEEPGEMM` (and with it `DEEPGEMM_BLACKWELL` and the UE8M0
scale format) is False on 12.0 and 12.1, so SGLang skips the DeepGEMM JIT warm-up and the UE8M0
weight requantization, and takes its non-DeepGEMM FP8 paths: block-FP8 linear layers use Triton's
`w8a8_block_fp8_matmul` (`triton_w8a8_block_fp8_linear`) on 0.5.3-0.5.6.post1, and on
0.5.6.post2-0.5.9 together with `sm120-fp8-block-gemm-triton` (0.5.10-0.5.15.post1 choose Triton
themselves, 0.5.16-0.5.20 their SM120 CUTLASS path); FP8 MoE without DeepEP keeps the Triton
fused-MoE kernels it already used. With `--moe-a2a-backend deepep`, whose normal and low-latency
modes need DeepGEMM, startup now stops at SGLang's own "DeepEP ... mode requires deep_gemm"
assertion: a clean refusal, not a working DeepEP. Other capabilities are untouched.

Delete when: the oldest release in use is 0.5.21 or newer.
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

FUNCTION = "_compute_enable_deep_gemm"
SM120, SM121 = 120, 121

# 0.5.4 moved the wrapper out of quantization/.
CONFIGURER = ByRelease(
    {
        "<0.5.4": "srt/layers/quantization/deep_gemm_wrapper/configurer.py",
        ">=0.5.4": "srt/layers/deep_gemm_wrapper/configurer.py",
    }
)

# 0.5.13's branch, for 0.5.21's capabilities.
GATE = """\
# DeepGEMM requires TMEM/tcgen05 (SM100+datacenter), not available on SM120/SM121
if sm_version in (120, 121):
    return False
"""


def _is_sm_version(node: cst.BaseExpression) -> bool:
    """`sm_version` or `get_device_sm()`: the configurer's two spellings of the device's SM."""
    if isinstance(node, cst.Name):
        return node.value == "sm_version"
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "get_device_sm"
        and not node.args
    )


def _sm_comparisons(node: cst.CSTNode) -> list[tuple[cst.Comparison, cst.ComparisonTarget]]:
    return [
        (comparison, comparison.comparisons[0])
        for comparison in cst_tools.walk(node, cst.Comparison)
        if _is_sm_version(comparison.left) and len(comparison.comparisons) == 1
    ]


def _narrow(node: cst.CSTNode) -> list[cst.Comparison]:
    """`sm_version == 120`: SM120 singled out, SM121 left behind."""
    return [
        comparison
        for comparison, target in _sm_comparisons(node)
        if isinstance(target.operator, cst.Equal)
        and isinstance(target.comparator, cst.Integer)
        and target.comparator.evaluated_value == SM120
    ]


def _wide(node: cst.CSTNode) -> list[cst.Comparison]:
    """`sm_version in (120, 121)`."""
    return [
        comparison
        for comparison, target in _sm_comparisons(node)
        if isinstance(target.operator, cst.In)
        and isinstance(target.comparator, cst.Tuple)
        and {
            e.value.evaluated_value
            for e in target.comparator.elements
            if isinstance(e.value, cst.Integer)
        }
        == {SM120, SM121}
    ]


def _hopper_gate(function: cst.FunctionDef) -> cst.If:
    """The top-level `if ... sm_version < 90 ...: return False` of the function."""
    gates = [
        statement
        for statement in cst_tools.function_body(function)
        if isinstance(statement, cst.If)
        and any(
            isinstance(target.operator, cst.LessThan)
            and isinstance(target.comparator, cst.Integer)
            and target.comparator.evaluated_value == 90
            for _, target in _sm_comparisons(statement.test)
        )
    ]
    if len(gates) != 1:
        raise AnchorMissing(f"{FUNCTION} has {len(gates)} `sm_version < 90` gates, expected one")
    return gates[0]


class Sm120DeepGemmOff(Patch):
    """DeepGEMM stays off on capability 12.0 and 12.1 (0.5.13's rule, 0.5.21's capabilities)."""

    id = "sm120-deep-gemm-off"
    description = "DeepGEMM off on capability 12.0/12.1: its kernels need SM90 wgmma or SM100 TMEM"
    symptom = (
        "FP8 block-quantized models (DeepSeek, Qwen3 FP8) fail in DeepGEMM kernels that "
        "sm_120/sm_121 cannot run"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.21")
    files = CONFIGURER
    concerns = Concerns(quantization=("fp8",))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = cst_tools.find_function(module, FUNCTION)
        narrow = _narrow(module)
        if narrow:  # 0.5.13-0.5.20: as 0.5.21, SM121 joins each SM120 check
            for comparison in narrow:
                wide = comparison.with_changes(
                    comparisons=[
                        cst.ComparisonTarget(
                            operator=cst.In(), comparator=cst.parse_expression("(120, 121)")
                        )
                    ]
                )
                module = cst_tools.replace(module, comparison, wide)
            return module
        if _wide(function):
            raise AlreadyPresent(f"{FUNCTION} already checks sm_version in (120, 121)")
        gate = _hopper_gate(function)
        branch = cst_tools.statement(GATE, module)
        new = cst_tools.with_statements_beside(function, gate, [branch], after=True)
        return cst_tools.replace(module, function, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        function = cst_tools.find_function(module, FUNCTION)
        if _narrow(module):
            raise PostconditionFailed("a `sm_version == 120` check still leaves out SM121")
        checks = [
            statement for statement in cst_tools.walk(function, cst.If) if _wide(statement.test)
        ]
        if not checks:
            raise PostconditionFailed(f"{FUNCTION} has no branch for sm_version in (120, 121)")
