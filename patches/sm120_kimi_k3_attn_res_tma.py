"""Keep capability 12 off Kimi-K3's TMA attention-residual kernel (tcgen05, setmaxnreg: SM100 only).

Why: Kimi-K3's attention residuals (`srt/layers/attn_residual.py`) aggregate the snapshot bank
with a JIT-built, warp-specialized CUDA kernel (`kimi_k3/attn_res/fused_tma.cuh`) whenever
`_use_fast()` says so, and in 0.5.17 and 0.5.18 it says so on `major >= 10` at hidden size 7168.
That kernel is written with tcgen05 and `setmaxnreg`, which SM120/SM121 do not have, and is
built for `sm_120a`/`sm_121a` there, so on an RTX PRO 6000 / RTX 5090 / GB10 Kimi-K3 cannot get
it at its first forward pass (read from the kernel source, not run on a GPU) instead of taking the
Triton pipeline that every other GPU without the fast kernel uses. 0.5.19 moved the
test into `_supports_attn_res_tma()` as `major >= 10 and major != 12` (and its kernel refuses
"SM100+ excluding SM12x"); this patch makes the same change in place.

Delete when: the oldest release in use is 0.5.19 or newer. Kimi-K3 first ships in 0.5.17.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AlreadyUpstream,
    AnchorMissing,
    ByRelease,
    Concerns,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

TARGET = ByRelease({"<0.5.17": None, ">=0.5.17": "srt/layers/attn_residual.py"})
FIXED = Version("0.5.19")
GATE, UPSTREAM = "_use_fast", "_supports_attn_res_tma"
OLD, NEW = "major >= 10", "major >= 10 and major != 12"
COMMENT = "# sglpatch: the TMA kernel needs tcgen05/setmaxnreg, not on SM12x (SGLang 0.5.19)"


def _assignment(function: cst.FunctionDef) -> cst.SimpleStatementLine:
    """The one `_FAST_SUPPORTED = <test>` line inside `_use_fast`."""
    found = [
        line
        for block in cst_tools.walk(function, cst.IndentedBlock)
        for line in block.body
        if isinstance(line, cst.SimpleStatementLine)
        and isinstance(line.body[0], cst.Assign)
        and isinstance(line.body[0].targets[0].target, cst.Name)
        and line.body[0].targets[0].target.value == "_FAST_SUPPORTED"
    ]
    if len(found) != 1:
        raise AnchorMissing(f"{GATE}() assigns _FAST_SUPPORTED {len(found)} times")
    return found[0]


def _test(module: cst.Module, line: cst.SimpleStatementLine) -> str:
    return module.code_for_node(cst.ensure_type(line.body[0], cst.Assign).value)


class Sm120KimiK3AttnResTma(Patch):
    """Turn `_FAST_SUPPORTED = major >= 10` into 0.5.19's `major >= 10 and major != 12`."""

    id = "sm120-kimi-k3-attn-res-tma"
    description = "Kimi-K3 attention residuals on capability 12: Triton, not the SM100 TMA kernel"
    symptom = (
        "Kimi-K3 fails at its first forward pass: the fused TMA attention-residual kernel "
        "(tcgen05, setmaxnreg) does not build for SM120/SM121"
    )
    tested = TESTED
    fixed_upstream_in = FIXED
    files = TARGET
    concerns = Concerns(architectures=("KimiK3ForConditionalGeneration",))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        if UPSTREAM in functions:
            raise AlreadyUpstream(f"{UPSTREAM}() decides the fast path (0.5.19)")
        if GATE not in functions:
            raise AnchorMissing(f"no {GATE}() helper")
        line = _assignment(functions[GATE])
        test = _test(module, line)
        if test == NEW:
            raise AlreadyPresent(f"{GATE}() already keeps capability 12 off the TMA kernel")
        if test != OLD:
            raise AnchorMissing(f"{GATE}() sets _FAST_SUPPORTED = {test}, not {OLD}")
        assign = cst.ensure_type(line.body[0], cst.Assign)
        new = line.with_changes(
            body=[assign.with_changes(value=cst.parse_expression(NEW))],
            leading_lines=[*line.leading_lines, cst.EmptyLine(comment=cst.Comment(COMMENT))],
        )
        return cst_tools.replace(module, line, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        if GATE not in functions or _test(module, _assignment(functions[GATE])) != NEW:
            raise PostconditionFailed(f"{GATE}() still admits capability 12")
