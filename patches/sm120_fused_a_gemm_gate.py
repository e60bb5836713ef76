"""Keep capability 12 off DeepSeek's min-latency fused_a_gemm kernel.

Why: `DeepseekV2AttentionMLA.__init__` turns on sgl-kernel's `dsv3_fused_a_gemm` for a bf16
fused q/kv-a projection of shape 2112 x 7168 (DeepSeek V3 / Kimi K2 attention, e.g. the bf16
attention of INT4 Kimi K2 checkpoints) whenever `_device_sm >= 90`, and that kernel has no
SM120 build: the first forward pass fails on capability 12. 0.5.4.post2 bounded the gate to
`90 <= _device_sm < 120`; this patch makes the same change.

Delete when: the oldest release in use is 0.5.4.post2 or newer. (0.5.15 dropped the bound again
when fused_a_gemm gained a CuTe DSL path for SM120; from there this patch has nothing to do.)
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

MODEL = ByRelease({"<0.5.15": "srt/models/deepseek_v2.py"})
CLASS, FLAG, SM = "DeepseekV2AttentionMLA", "use_min_latency_fused_a_gemm", "_device_sm"
BOUNDED = "90 <= _device_sm < 120"  # upstream's spelling (0.5.4.post2)


def _is_sm(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == SM


def _sm_tests(expression: cst.CSTNode) -> list[cst.Comparison]:
    return [c for c in cst_tools.walk(expression, cst.Comparison) if _mentions_sm(c)]


def _mentions_sm(comparison: cst.Comparison) -> bool:
    return _is_sm(comparison.left) or any(_is_sm(t.comparator) for t in comparison.comparisons)


def _bounded_below_120(comparison: cst.Comparison) -> bool:
    """`... _device_sm < 120` (or `<= 119`): capability 12 is kept out."""
    operands = [comparison.left, *(t.comparator for t in comparison.comparisons)]
    for index, target in enumerate(comparison.comparisons):
        left, right = operands[index], operands[index + 1]
        if _is_sm(left) and isinstance(right, cst.Integer):
            if isinstance(target.operator, cst.LessThan) and int(right.value) <= 120:
                return True
            if isinstance(target.operator, cst.LessThanEqual) and int(right.value) < 120:
                return True
    return False


class Sm120FusedAGemmGate(Patch):
    """Bound DeepSeek's fused_a_gemm gate to `90 <= _device_sm < 120`, as 0.5.4.post2 does."""

    id = "sm120-fused-a-gemm-gate"
    description = "DeepSeek's min-latency fused_a_gemm (no SM120 build) only on SM90-SM11x"
    symptom = "DeepSeek/Kimi with bf16 attention weights fail in dsv3_fused_a_gemm on SM120"
    tested = TESTED
    fixed_upstream_in = Version("0.5.4.post2")
    files = MODEL
    concerns = Concerns(uses=("sglang.srt.models.deepseek_v2",))
    reads = (f"{CLASS}.__init__",)

    def _flag_value(self, module: cst.Module) -> cst.BaseExpression:
        init = cst_tools.methods(cst_tools.find_class(module, CLASS)).get("__init__")
        if init is None:
            raise AnchorMissing(f"{CLASS} has no __init__")
        for line in cst_tools.walk(init, cst.SimpleStatementLine):
            for small in line.body:
                if (
                    isinstance(small, cst.Assign)
                    and isinstance(small.targets[0].target, cst.Attribute)
                    and small.targets[0].target.attr.value == FLAG
                ):
                    return small.value
        raise AnchorMissing(f"{CLASS}.__init__ does not set self.{FLAG}")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        tests = _sm_tests(self._flag_value(module))
        if any(_bounded_below_120(t) for t in tests):
            raise AlreadyPresent(f"self.{FLAG} already requires {SM} < 120")
        lower = [
            t
            for t in tests
            if len(t.comparisons) == 1
            and _is_sm(t.left)
            and isinstance(t.comparisons[0].operator, cst.GreaterThanEqual)
            and isinstance(t.comparisons[0].comparator, cst.Integer)
            and t.comparisons[0].comparator.value == "90"
        ]
        if len(lower) != 1:
            raise AnchorMissing(f"self.{FLAG} has no single `{SM} >= 90` test")
        bounded = cst.parse_expression(BOUNDED, config=module.config_for_parsing)
        return cst_tools.replace(module, lower[0], bounded)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if not any(_bounded_below_120(t) for t in _sm_tests(self._flag_value(module))):
            raise PostconditionFailed(f"self.{FLAG} still admits {SM} 120")
