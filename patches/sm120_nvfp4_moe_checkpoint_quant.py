"""NVFP4 MoE checkpoints started without `--quantization` get FlashInfer CUTLASS on capability 12.

Why: the ModelOpt NVFP4 MoE method turns `--moe-runner-backend auto` into FLASHINFER_TRTLLM
(`ModelOptNvFp4FusedMoEMethod.create_moe_runner`; from 0.5.13 Marlin only for 8.0 <= capability
< 10.0), and FlashInfer's trtllm-gen MoE kernels exist for SM100 only. The one branch that gives
capability 12 `flashinfer_cutlass` instead (`ServerArgs._handle_moe_kernel_config`, 0.5.13-0.5.14;
`_moe_runner_backend_quant_constraints` in `arg_groups/overrides.py` from 0.5.15) tests the
server argument `quantization == "modelopt_fp4"`. SGLang finds an NVFP4 checkpoint by itself
(ModelConfig resolves the checkpoint's `modelopt` + `NVFP4` to `modelopt_fp4`), so most users pass
no `--quantization`, and on 12 nothing copies the checkpoint's quantization into the argument:
the DeepSeek, Qwen3-MoE, GLM4-MoE and Gemma4 overrides that do run on SM100 only. The argument
stays None, `auto` stays `auto`, the layer builds a trtllm-gen runner, and the first MoE layer
fails ("MoE kernel requires 10.x architecture", or no cubin for the device). `layers/moe/utils.py`
copies the resolved argument and does not resolve it again. The runner alone cannot be switched
in `create_moe_runner`: the method prepares the weights for the global backend
(`enable_flashinfer_cutlass_moe`, `enable_flashinfer_trtllm_moe`), so the choice must be made
where upstream makes it, before the layers exist.

This patch widens that branch's test: `auto`, SM120, and `modelopt_fp4` or `modelopt_mixed` from
the flag or, when no `--quantization` was given, as the checkpoint's resolved quantization
(`self.get_model_config()` to 0.5.14, `view.get_model_config()` 0.5.15-0.5.18,
`model_config_of(view)` from 0.5.19: the memoised ModelConfig each release's own resolution
reads). A flag that was given is kept as the only word: `--quantization modelopt` would fail
flashinfer_cutlass's own check of the flag. The capability test moves in front, so other
capabilities never read the model config here. On 0.5.11-0.5.12 the branch is not upstream's:
`sm120-nvfp4-moe-backend` inserts it already tested this way, so this patch starts at 0.5.13.

`modelopt_mixed` is what ModelConfig makes of a ModelOpt MIXED_PRECISION checkpoint with an
NVFP4 layer from 0.5.15 (nvidia's Qwen3.5 NVFP4 checkpoints: NVFP4 routed experts, FP8
attention); 0.5.10 - 0.5.14 give the name to NemotronH alone, whose own override already picks
flashinfer_cutlass on 12, so there the widening counts only for `--quantization modelopt_mixed`.
Its NVFP4 MoE layers get the same `ModelOptNvFp4FusedMoEMethod`, whose `auto` is trtllm-gen, and
upstream's branch does not name it, even with the flag (open PR #35617 adds it, as here).
flashinfer_cutlass's own check of the flag admits it. Not judged: a MIXED_PRECISION checkpoint
whose experts are FP8 while other layers are NVFP4 gets flashinfer_cutlass for its MoE layers
too (as with PR #35617): ModelOpt per-tensor FP8 experts through `ModelOptFp8MoEMethod`, whose
FlashInfer CUTLASS FP8 MoE was not read for 12; where `auto` gave them Triton, which runs there,
`--moe-runner-backend triton` keeps it (doctor says so for such checkpoints, as a known note).

Sources: the trace in the release trees (issue 19); flashinfer-ai/flashinfer PR #3670 (trtllm-gen
FP4 MoE has no SM120/SM121 cubins); sgl-project/sglang PR #35617 (open: the same SM120 branch
for `modelopt_mixed`, chosen before weight preparation for the same reason). The workaround
without sglpatch is `--quantization modelopt_fp4` or `--moe-runner-backend flashinfer_cutlass`.
12.1 (GB10) is routed too, as upstream routes it when the flag is given: docs/nvfp4-moe-gb10.md
weighs the GB10 reports of wrong output with this kernel (none isolates it) against the ones
that run it there.

Delete when: a release fixes it upstream (none has as of 0.5.23).
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    MOE_LAYERS,
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
from sglpatch.patches.sm120_nvfp4_moe_backend import METHOD, NVFP4_MOE

# sm120-nvfp4-moe-backend's files from 0.5.13: before, the branch is the one it inserts.
FILES = ByRelease(
    {
        ">=0.5.13,<0.5.15": "srt/server_args.py",
        ">=0.5.15": "srt/arg_groups/overrides.py",
    }
)
FP4 = "modelopt_fp4"
# The resolution pass holding upstream's branch in overrides.py (0.5.15 - 0.5.23).
PASS = "_moe_runner_backend_quant_constraints"

# How each release's resolution reads the memoised ModelConfig (`{owner}` is `self` or `view`).
MODEL_CONFIG = ByRelease(
    {
        ">=0.5.13,<0.5.19": "{owner}.get_model_config()",
        ">=0.5.19": "model_config_of({owner})",
    }
)

# The widened test, in the branch's own indentation once parsed into it.
TEST = """\
if (
    {others}
    and ({owner}.quantization or {model_config}.quantization)
    in ({quantizations})
):
    pass
"""


def _operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of an `a and b and c` chain, left to right."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_operands(test.left), *_operands(test.right)]
    return [test]


def _names_sm120(node: cst.CSTNode) -> bool:
    """`is_sm120_supported()` (to 0.5.18) or `get_platform().is_sm120` (from 0.5.19)."""
    names = any(n.value == "is_sm120_supported" for n in cst_tools.walk(node, cst.Name))
    return names or any(a.attr.value == "is_sm120" for a in cst_tools.walk(node, cst.Attribute))


def _reads_model_config(node: cst.CSTNode) -> bool:
    """A `<model config>.quantization` read: `get_model_config()` or `model_config_of(...)`."""
    for attribute in cst_tools.walk(node, cst.Attribute):
        call = attribute.value
        if attribute.attr.value != "quantization" or not isinstance(call, cst.Call):
            continue
        called = call.func
        if isinstance(called, cst.Attribute) and called.attr.value == "get_model_config":
            return True
        if isinstance(called, cst.Name) and called.value == "model_config_of":
            return True
    return False


def _flag_test(node: cst.BaseExpression) -> str | None:
    """`<owner>.quantization == "modelopt_fp4"` -> the owner's name (`self`, `view`)."""
    if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
        return None
    target = node.comparisons[0]
    left, right = node.left, target.comparator
    if not (
        isinstance(target.operator, cst.Equal)
        and isinstance(left, cst.Attribute)
        and left.attr.value == "quantization"
        and isinstance(left.value, cst.Name)
        and isinstance(right, cst.SimpleString)
        and right.value.strip("\"'") == FP4
    ):
        return None
    return left.value.value


def _assigns_cutlass(branch: cst.If) -> bool:
    for assign in cst_tools.walk(branch.body, cst.Assign):
        target = assign.targets[0].target
        name = target.attr.value if isinstance(target, cst.Attribute) else None
        name = target.value if isinstance(target, cst.Name) else name
        value = assign.value
        if (
            name == "moe_runner_backend"
            and isinstance(value, cst.SimpleString)
            and value.value.strip("\"'") == "flashinfer_cutlass"
        ):
            return True
    return False


def _branch(scope: cst.CSTNode) -> cst.If:
    """The one `if` that sends `auto` + modelopt_fp4 on SM120 to flashinfer_cutlass."""
    found = [
        b
        for b in cst_tools.walk(scope, cst.If)
        if _names_sm120(b.test)
        and any(s.value.strip("\"'") == FP4 for s in cst_tools.walk(b.test, cst.SimpleString))
        and _assigns_cutlass(b)
    ]
    if len(found) != 1:
        raise AnchorMissing(
            f"expected one modelopt_fp4 + SM120 -> flashinfer_cutlass branch, found {len(found)}"
        )
    return found[0]


class Sm120Nvfp4MoeCheckpointQuant(Patch):
    """Let the checkpoint's modelopt_fp4 reach upstream's SM120 flashinfer_cutlass branch."""

    id = "sm120-nvfp4-moe-checkpoint-quant"
    description = (
        "NVFP4 MoE `auto` resolves to flashinfer_cutlass on capability 12 when the quantization "
        "comes from the checkpoint or is modelopt_mixed"
    )
    symptom = (
        "NVFP4 MoE checkpoints started without --quantization, and ModelOpt mixed-precision ones, "
        "fail in FlashInfer trtllm-gen MoE (SM100-only kernels) on SM120"
    )
    tested = TESTED
    files = FILES
    concerns = Concerns(quantization=NVFP4_MOE, uses=MOE_LAYERS)
    reads = ByRelease({">=0.5.13,<0.5.15": (f"ServerArgs.{METHOD}",), ">=0.5.15": (PASS,)})

    def _scope(self, module: cst.Module, release: Version) -> cst.CSTNode:
        # The branch's own function, not the module: walking every node of the 1,500-line
        # overrides module took doctor a third of a second per pass.
        if release >= Version("0.5.15"):
            return cst_tools.find_function(module, PASS)
        method = cst_tools.methods(cst_tools.find_class(module, "ServerArgs")).get(METHOD)
        if method is None:
            raise AnchorMissing(f"ServerArgs has no {METHOD}()")
        return method

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        branch = _branch(self._scope(module, release))
        if _reads_model_config(branch.test):
            raise AlreadyPresent("the SM120 NVFP4 MoE branch already reads the model config")
        operands = _operands(branch.test)
        flags = [(i, owner) for i, op in enumerate(operands) if (owner := _flag_test(op))]
        if len(flags) != 1:
            raise AnchorMissing('the SM120 branch does not test `quantization == "modelopt_fp4"`')
        index, owner = flags[0]
        template = MODEL_CONFIG.get(release)
        if template is None:
            raise AnchorMissing(f"no model-config reader known for SGLang {release}")
        if template.startswith("model_config_of") and "model_config_of" not in set(
            cst_tools.imported_names(module)
        ):
            raise AnchorMissing("the overrides module does not import model_config_of")
        others = [module.code_for_node(op) for i, op in enumerate(operands) if i != index]
        text = TEST.format(
            others="\n    and ".join(others),
            owner=owner,
            quantizations=", ".join(f'"{q}"' for q in NVFP4_MOE),
            model_config=template.format(owner=owner),
        )
        parsed = cst.parse_module(text, config=module.config_for_parsing).body[0]
        if not isinstance(parsed, cst.If):
            raise AnchorMissing(f"the branch's operands do not make an `if` test: {others}")
        return cst_tools.replace(module, branch, branch.with_changes(test=parsed.test))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        try:
            branch = _branch(self._scope(module, release))
        except AnchorMissing as error:
            raise PostconditionFailed(str(error)) from None
        operands = _operands(branch.test)
        sm120 = next((i for i, op in enumerate(operands) if _names_sm120(op)), None)
        read = next((i for i, op in enumerate(operands) if _reads_model_config(op)), None)
        if read is None or sm120 is None:
            raise PostconditionFailed("the SM120 NVFP4 MoE branch ignores the checkpoint")
        named = {s.value.strip("\"'") for s in cst_tools.walk(operands[read], cst.SimpleString)}
        if not named.issuperset(NVFP4_MOE):
            raise PostconditionFailed(f"the SM120 NVFP4 MoE branch does not test {NVFP4_MOE}")
        if sm120 > read:
            raise PostconditionFailed("the model config is read before the SM120 test")
