"""Give capability 12 the non-persistent, block_k=128 triton_kernels MXFP4 weight layout.

Why: GPT-OSS's MXFP4 experts on the `triton_kernel` MoE runner are swizzled by `_swizzle_mxfp4`
for the persistent/TMA matmul of Hopper and B200, and triton_kernels then sizes the tile for that
path. Capability-12 parts (RTX PRO 6000, RTX 5090, GB10) have about 100 KB of shared memory per
block: not even one pipeline stage of that tile fits, and start-up dies in triton_kernels'
`make_default_opt_flags_nvidia` with `assert num_stages >= 1`. That is the default GPT-OSS path on
capability 12 for 0.5.3 to 0.5.4.post1 (and from 0.5.4.post2 with `--moe-runner-backend
triton_kernel`, or once `sm120-mxfp4-moe-backend` sends capability 12 there).

SGLang 0.5.10 fixed it in SGLang's own Python: on capability 12, `_swizzle_mxfp4` keeps the
weights in triton_kernels' `StridedLayout` and constrains the matmul to `is_persistent=False`,
`block_k=128`, `num_stages=1`. No new kernel or wheel is needed: the constraint keys and
`StridedLayout` belong to the same triton_kernels API (`matmul_ogs`) the old releases already
import. This patch inserts that branch; every other capability keeps its layout and constraints.

Delete when: the oldest release in use is 0.5.10 or newer. (0.5.14 dropped the branch when it
made Marlin the MXFP4 MoE runner of capability 12; this patch leaves 0.5.14 and later alone.)
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

FUNCTION = "_swizzle_mxfp4"
HELPER = "is_sm120_supported"
TARGET = ByRelease({"<0.5.14": "srt/layers/quantization/mxfp4.py", ">=0.5.14": None})
# `is_sm120_supported` arrived in sglang.srt.utils in 0.5.4; before it, ask torch directly
# (the helper's own test, without its CUDA >= 12.8 check, which capability 12 always meets).
HELPER_GATE = f"{HELPER}()"
TORCH_GATE = "torch.cuda.get_device_capability()[0] == 12"
GATE = ByRelease({"<0.5.4": TORCH_GATE, ">=0.5.4": HELPER_GATE})

BRANCH = """\
if {gate}:
    # Capability 12 has no persistent/TMA MXFP4 matmul and ~100 KB of shared memory per block:
    # strided weights, the non-persistent kernel and block_k=128 keep one stage within it
    # (sglpatch: SGLang 0.5.10's branch).
    from triton_kernels.tensor_details.layout import StridedLayout

    value_layout = StridedLayout
    value_layout_opts = {{}}
    scale_layout = StridedLayout
    scale_layout_opts = {{}}
    constraints = {{
        "is_persistent": False,
        "block_k": 128,
        "num_stages": 1,
    }}
    opt_flags.update_opt_flags_constraints(constraints)
else:
    pass
"""


def _swizzle(module: cst.Module) -> cst.FunctionDef:
    found = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == FUNCTION]
    if len(found) != 1:
        raise AnchorMissing(f"expected one function {FUNCTION}, found {len(found)}")
    return found[0]


def _is_gate(test: cst.BaseExpression, module: cst.Module) -> bool:
    return module.code_for_node(test) in {HELPER_GATE, TORCH_GATE}


def _sm120_branches(function: cst.FunctionDef, module: cst.Module) -> list[cst.If]:
    return [n for n in cst_tools.find_compound(function, cst.If) if _is_gate(n.test, module)]


def _calls(node: cst.CSTNode, name: str) -> bool:
    return any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == name
        for c in cst_tools.walk(node, cst.Call)
    )


def _default_layout(body: list[cst.BaseStatement]) -> tuple[int, int]:
    """Where the default (Hopper/B200) layout and constraints start and end in the body:
    from `value_layout, ... = layout.make_default_matmul_mxfp4_w_layout(...)` to the
    `if _is_sm100_supported:` / `if is_sm100_supported():` constraints chain."""
    start = next(
        (i for i, s in enumerate(body) if _calls(s, "make_default_matmul_mxfp4_w_layout")), None
    )
    if start is None:
        raise AnchorMissing(f"{FUNCTION} does not build the default MXFP4 weight layout")
    end = next(
        (
            i
            for i, s in enumerate(body[start:], start)
            if isinstance(s, cst.If) and _calls(s, "update_opt_flags_constraints")
        ),
        None,
    )
    if end is None:
        raise AnchorMissing(f"{FUNCTION} sets no opt_flags constraints after the layout")
    return start, end


class Sm120TritonKernelsMxfp4BlockK(Patch):
    """Insert SGLang 0.5.10's capability-12 branch into `_swizzle_mxfp4`."""

    id = "sm120-triton-kernels-mxfp4-block-k"
    description = "triton_kernels MXFP4 MoE on capability 12: strided weights, block_k=128 (0.5.10)"
    symptom = "GPT-OSS on the triton_kernel MoE runner dies at start-up: assert num_stages >= 1"
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = TARGET
    concerns = Concerns(architectures=("GptOssForCausalLM",), quantization=("mxfp4",))
    reads = (FUNCTION,)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = _swizzle(module)
        if _sm120_branches(function, module):
            raise AlreadyPresent(f"{FUNCTION} has a branch for capability 12")
        gate = GATE.get(release) or HELPER_GATE
        importing = self._utils_import(module) if gate == HELPER_GATE else None
        if importing is None and not any(
            isinstance(s, cst.SimpleStatementLine)
            and module.code_for_node(s).strip() == "import torch"
            for s in module.body
        ):
            raise AnchorMissing("the module does not import torch")
        if not isinstance(function.body, cst.IndentedBlock):
            raise AnchorMissing(f"{FUNCTION} has no indented body")
        body = list(function.body.body)
        start, end = _default_layout(body)
        template = cst_tools.statement(BRANCH.format(gate=gate), module)
        if not (isinstance(template, cst.If) and isinstance(template.orelse, cst.Else)):
            raise AnchorMissing("the capability-12 branch did not parse as an if/else statement")
        # The release's own layout and constraints become the `else:` of every other capability.
        kept = body[start : end + 1]
        first = kept[0]
        if not isinstance(first, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            raise AnchorMissing(f"unexpected statement in {FUNCTION}")
        # Blank lines stay above the new `if`; comments stay with the code they describe.
        above = list(first.leading_lines)
        split = next((i for i, line in enumerate(above) if line.comment is not None), len(above))
        kept[0] = first.with_changes(leading_lines=above[split:])
        branch = template.with_changes(
            leading_lines=above[:split],
            orelse=template.orelse.with_changes(body=template.orelse.body.with_changes(body=kept)),
        )
        new_body = [*body[:start], branch, *body[end + 1 :]]
        patched = cst_tools.replace(
            module, function, function.with_changes(body=function.body.with_changes(body=new_body))
        )
        if importing is None or self._imports_helper(importing):
            return patched
        return cst_tools.replace(patched, importing, cst_tools.with_alias(importing, HELPER))

    @staticmethod
    def _utils_import(module: cst.Module) -> cst.ImportFrom:
        found = [
            small
            for s in module.body
            if isinstance(s, cst.SimpleStatementLine)
            for small in s.body
            if isinstance(small, cst.ImportFrom)
            and small.module is not None
            and module.code_for_node(small.module) == "sglang.srt.utils"
            and not isinstance(small.names, cst.ImportStar)
        ]
        if len(found) != 1:
            raise AnchorMissing(
                f"expected one `from sglang.srt.utils import ...`, found {len(found)}"
            )
        return found[0]

    @staticmethod
    def _imports_helper(node: cst.ImportFrom) -> bool:
        if isinstance(node.names, cst.ImportStar):  # _utils_import picks named imports only
            raise AnchorMissing("a star import names no helper")
        return any(isinstance(a.name, cst.Name) and a.name.value == HELPER for a in node.names)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        branches = _sm120_branches(_swizzle(module), module)
        if len(branches) != 1:
            raise PostconditionFailed(f"{FUNCTION} has {len(branches)} branches for capability 12")
        if not _calls(branches[0].body, "update_opt_flags_constraints"):
            raise PostconditionFailed("capability 12's branch sets no opt_flags constraints")
        imported = cst_tools.imported_names(module, "sglang.srt.utils")
        if module.code_for_node(branches[0].test) == HELPER_GATE and HELPER not in imported:
            raise PostconditionFailed(f"the module does not import {HELPER}")
