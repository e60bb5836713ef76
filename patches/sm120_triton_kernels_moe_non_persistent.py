"""Keep triton_kernels' MoE matmul_ogs on its non-persistent kernel on capability 12.

Why: the `triton_kernel` MoE runner (`--moe-runner-backend triton_kernel`, GPT-OSS's MXFP4
experts or bf16 experts) calls triton_kernels' `matmul_ogs`, which picks its persistent kernel
with TMA gather/scatter when it can. Capability-12 parts (RTX PRO 6000, RTX 5090, GB10) cannot
run that path. Until 0.5.13 SGLang's `_swizzle_mxfp4` constrained the MXFP4 weights to
`is_persistent=False` on SM120 (upstream from 0.5.10, `sm120-triton-kernels-mxfp4-block-k`
before); 0.5.14 dropped that branch when Marlin became capability 12's MXFP4 MoE runner, so
0.5.14 to 0.5.16 hand the persistent kernel to an SM120 user who picks `triton_kernel`.
0.5.17 added, at import of `triton_kernels_moe.py`:
`if is_sm120_supported(): update_opt_flags_constraints({"is_persistent": False})`.
This patch inserts the same import-time branch (and its two imports) where 0.5.17 has them.

Delete when: the oldest release in use is 0.5.17 or newer (0.5.19 spells the gate
`get_platform().is_sm120`; both are recognised as upstream's). Releases before 0.5.14 keep the
constraint in `_swizzle_mxfp4`: not for them.
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

TARGET = ByRelease(
    {"<0.5.14": None, ">=0.5.14": "srt/layers/moe/fused_moe_triton/triton_kernels_moe.py"}
)
FIXED = Version("0.5.17")
UPDATE = "update_opt_flags_constraints"
HELPER = "is_sm120_supported"
HELPER_SOURCE = "sglang.srt.utils.common"  # where 0.5.17 imports it from
UTILS = "sglang.srt.utils"
# The module `matmul_ogs` comes from names its opt_flags module (triton_kernels renamed both).
MATMUL_MODULES = ("triton_kernels.matmul_ogs", "triton_kernels.matmul")

BRANCH = """\
if is_sm120_supported():
    # Capability 12 has no persistent (TMA gather/scatter) matmul_ogs: use the regular
    # gather/scatter kernel (sglpatch: SGLang 0.5.17's import-time constraint).
    update_opt_flags_constraints({"is_persistent": False})
"""


def _gates_sm120(test: cst.BaseExpression, module: cst.Module) -> bool:
    """`is_sm120_supported()` (0.5.17, 0.5.18) or `get_platform().is_sm120` (from 0.5.19)."""
    return module.code_for_node(test) in {f"{HELPER}()", "get_platform().is_sm120"}


def _forces_non_persistent(branch: cst.If) -> bool:
    for call in cst_tools.walk(branch.body, cst.Call):
        if not (isinstance(call.func, cst.Name) and call.func.value == UPDATE and call.args):
            continue
        table = call.args[0].value
        if not isinstance(table, cst.Dict):
            continue
        for element in table.elements:
            if (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "is_persistent"
                and isinstance(element.value, cst.Name)
                and element.value.value == "False"
            ):
                return True
    return False


def _sm120_branches(module: cst.Module) -> list[cst.If]:
    """Top-level `if <SM120>: update_opt_flags_constraints({"is_persistent": False})`."""
    return [
        s
        for s in module.body
        if isinstance(s, cst.If) and _gates_sm120(s.test, module) and _forces_non_persistent(s)
    ]


def _import_line(module: cst.Module, source: str) -> cst.SimpleStatementLine:
    """The top-level line holding `from <source> import ...` (exactly one)."""
    found = [
        line
        for line in module.body
        if isinstance(line, cst.SimpleStatementLine)
        and any(
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and not small.relative
            and module.code_for_node(small.module) == source
            for small in line.body
        )
    ]
    if len(found) != 1:
        raise AnchorMissing(f"expected one `from {source} import ...`, found {len(found)}")
    return found[0]


def _matmul_import(module: cst.Module) -> tuple[cst.SimpleStatementLine, str]:
    """The `from triton_kernels.matmul_ogs import (..., matmul_ogs)` line and its opt_flags."""
    for source in MATMUL_MODULES:
        if cst_tools.imported_names(module, source):
            return _import_line(module, source), f"{source}_details.opt_flags"
    raise AnchorMissing("the module imports no triton_kernels matmul")


class Sm120TritonKernelsMoeNonPersistent(Patch):
    """Insert 0.5.17's import-time `is_persistent=False` constraint for capability 12."""

    id = "sm120-triton-kernels-moe-non-persistent"
    description = "triton_kernel MoE runner on capability 12: non-persistent matmul_ogs (0.5.17)"
    symptom = (
        "--moe-runner-backend triton_kernel on SM120 gets triton_kernels' persistent TMA "
        "matmul_ogs, which capability 12 cannot run"
    )
    tested = TESTED
    fixed_upstream_in = FIXED
    files = TARGET
    concerns = Concerns(flag="--moe-runner-backend triton_kernel")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        if _sm120_branches(module):
            raise AlreadyPresent("matmul_ogs is constrained to is_persistent=False on SM120")
        if release >= FIXED:
            raise AnchorMissing("the module lost upstream's SM120 is_persistent constraint")
        matmul, opt_flags = _matmul_import(module)
        utils = _import_line(module, UTILS)
        if list(module.body).index(utils) < list(module.body).index(matmul):
            raise AnchorMissing(f"`from {UTILS} import ...` comes before the matmul import")
        new_imports: list[cst.BaseStatement] = []
        if UPDATE not in cst_tools.imported_names(module, opt_flags):
            new_imports.append(cst_tools.statement(f"from {opt_flags} import {UPDATE}\n", module))
        helper: list[cst.BaseStatement] = []
        if HELPER not in cst_tools.imported_names(module, UTILS) + cst_tools.imported_names(
            module, HELPER_SOURCE
        ):
            helper.append(cst_tools.statement(f"from {HELPER_SOURCE} import {HELPER}\n", module))
        branch = cst_tools.statement(BRANCH, module).with_changes(
            leading_lines=[cst.EmptyLine(indent=False)]
        )
        # As 0.5.17 lays it out: the opt_flags import right after the matmul import, the helper
        # after the sglang.srt.utils import, the branch after that behind one blank line.
        body: list[cst.BaseStatement] = []
        for statement in module.body:
            body.append(statement)
            if statement is matmul:
                body.extend(new_imports)
            elif statement is utils:
                body.extend([*helper, branch])
        return module.with_changes(body=body)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        branches = _sm120_branches(module)
        if len(branches) != 1:
            raise PostconditionFailed(f"{len(branches)} SM120 is_persistent constraints")
        _, opt_flags = _matmul_import(module)
        if UPDATE not in cst_tools.imported_names(module, opt_flags):
            raise PostconditionFailed(f"the module does not import {UPDATE} from {opt_flags}")
        if module.code_for_node(branches[0].test) == f"{HELPER}()" and HELPER not in (
            cst_tools.imported_names(module, UTILS)
            + cst_tools.imported_names(module, HELPER_SOURCE)
        ):
            raise PostconditionFailed(f"the module does not import {HELPER}")
