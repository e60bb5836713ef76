"""Refuse `--enable-flashinfer-allreduce-fusion` at TP > 1 on capability 12, as a one-line error.

Why: asked for on a capability-12 GPU (RTX PRO 6000, RTX 5090, GB10) at TP > 1, the flag makes
0.5.3 - 0.5.7 fuse each MoE layer's all-reduce into the next layer's
`flashinfer_allreduce_residual_rmsnorm`: `should_fuse_mlp_allreduce_with_next_layer` of
`LayerCommunicator` asks for the flag, the TP size and DP attention, not the capability (GPT-OSS,
DeepSeek-V2/V3, GLM-4.5, Qwen3-MoE, Bailing and MiMo-V2-Flash use it). The fused op's first call
creates the workspace and builds FlashInfer's `trtllm_comm` JIT module, whose
`gen_trtllm_comm_module` (flashinfer/jit/comm.py) lists `supported_major_versions=[9, 10]` in
every FlashInfer these releases pin (0.4.0rc3 to 0.5.3): start-up dies in CUDA graph capture with
"No supported CUDA architectures found for major versions [9, 10]", after the weights are loaded.
`sm120-allreduce-fusion-auto-gate` stops SGLang from turning the flag on by itself on 12; this
patch is the other half, for the user who asks for it.

What upstream did: 0.5.8 added the capability test to `should_fuse_mlp_allreduce_with_next_layer`
(`apply_flashinfer_allreduce_fusion`: SM90 or SM100), so 0.5.8 - 0.5.13 ignore the flag on 12
(0.5.11 - 0.5.13 also set up its workspace first when the flag is set, in a `try` that logs
"Failed to initialize FlashInfer workspace" and turns the fusion off: read, not run here). 0.5.14
replaced the flag by `--flashinfer-allreduce-fusion-backend` and refuses it on 12 when the model
runner sets up the fusion workspace at a world size above 1, for every model: "FlashInfer
allreduce fusion requires SM90 or SM10X NVIDIA GPUs" (`_resolve_backend`,
layers/flashinfer_comm_fusion.py). This patch gives 0.5.3 - 0.5.7 that refusal at argument time:
`ServerArgs.__post_init__` raises a ValueError naming the flag right before the model-specific
adjustments (which may turn the flag on themselves: only what the user asked is refused). 8.9,
9.0 and 10.0, and TP 1 on 12 (no all-reduce to fuse), start as before. On 12 at TP > 1 the flag
is refused for every model, as 0.5.14+ refuses it: also for a model that never fuses, which
0.5.3 - 0.5.7 start with the flag ignored.

Sources: sgl-project/sglang issue #15650 and PR #16283 (the auto-enabled case); PR #28789 ("outside
SM90/SM10X, for example SM120: hard error"); flashinfer-ai/flashinfer flashinfer/jit/comm.py
(v0.4.0 - v0.6.15.post1: [9, 10]; v0.6.17, PR #3903, adds 12).

Delete when: the oldest release in use is 0.5.8 or newer.
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

TARGET = ByRelease({"<0.5.8": "srt/server_args.py"})
FLAG = "enable_flashinfer_allreduce_fusion"
ADJUSTMENTS = "_handle_model_specific_adjustments"
SM = "get_device_sm"  # 0.5.3.x's server_args does not import it; 0.5.4+ does
SOURCES = ("sglang.srt.utils", "sglang.srt.utils.common")
MESSAGE = (
    "--enable-flashinfer-allreduce-fusion is not supported on compute capability 12 "
    "(SM120/SM121): FlashInfer's TRT-LLM all-reduce fusion kernels are built for SM90 "
    "and SM100 only. Remove the flag."
)
REFUSAL = f"""\
# sglpatch: FlashInfer's TRT-LLM all-reduce fusion JIT lists majors 9 and 10 only
if (
    self.{FLAG}
    and self.tp_size > 1
    and is_cuda()
    and {SM}() // 10 == 12
):
    raise ValueError(
        "--enable-flashinfer-allreduce-fusion is not supported on compute capability 12 "
        "(SM120/SM121): FlashInfer's TRT-LLM all-reduce fusion kernels are built for SM90 "
        "and SM100 only. Remove the flag."
    )
"""


def _post_init(module: cst.Module) -> cst.FunctionDef:
    method = cst_tools.methods(cst_tools.find_class(module, "ServerArgs")).get("__post_init__")
    if method is None:
        raise AnchorMissing("ServerArgs has no __post_init__")
    return method


def _adjustments(method: cst.FunctionDef) -> cst.SimpleStatementLine:
    """`self._handle_model_specific_adjustments()`, a top-level statement of `__post_init__`."""
    found = [
        s
        for s in cst_tools.function_body(method)
        if isinstance(s, cst.SimpleStatementLine)
        and len(s.body) == 1
        and isinstance(s.body[0], cst.Expr)
        and isinstance(call := s.body[0].value, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == "self"
        and call.func.attr.value == ADJUSTMENTS
    ]
    if len(found) != 1:
        raise AnchorMissing(f"__post_init__ calls self.{ADJUSTMENTS}() {len(found)} times")
    return found[0]


def _refusals(method: cst.FunctionDef) -> list[cst.If]:
    """Top-level `if self.enable_flashinfer_allreduce_fusion ... : raise ValueError(...)`."""
    return [
        s
        for s in cst_tools.function_body(method)
        if isinstance(s, cst.If)
        and any(a.attr.value == FLAG for a in cst_tools.walk(s.test, cst.Attribute))
        and any(
            isinstance(r.exc, cst.Call)
            and isinstance(r.exc.func, cst.Name)
            and r.exc.func.value == "ValueError"
            for r in cst_tools.walk(s.body, cst.Raise)
        )
    ]


class Sm120AllreduceFusionRefusal(Patch):
    """Refuse the explicit fusion flag on capability 12 at TP > 1, before the adjustments."""

    id = "sm120-allreduce-fusion-refusal"
    description = "--enable-flashinfer-allreduce-fusion on capability 12 at TP > 1: a ValueError"
    symptom = (
        "--enable-flashinfer-allreduce-fusion at TP > 1 dies in CUDA graph capture: "
        "No supported CUDA architectures found for major versions [9, 10]"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.8")
    files = TARGET
    concerns = Concerns(flag="--enable-flashinfer-allreduce-fusion")
    reads = ("ServerArgs.__post_init__",)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        method = _post_init(module)
        if _refusals(method):
            raise AlreadyPresent("ServerArgs refuses the fusion flag on capability 12")
        anchor = _adjustments(method)
        if "is_cuda" not in cst_tools.imported_names(module):
            raise AnchorMissing("the module does not import is_cuda")
        refusal = cst_tools.statement(REFUSAL, module)
        module = cst_tools.replace(
            module, method, cst_tools.with_statements_beside(method, anchor, [refusal], after=False)
        )
        if SM in cst_tools.imported_names(module):
            return module
        source = next((s for s in SOURCES if cst_tools.imported_names(module, s)), None)
        if source is None:
            raise AnchorMissing(f"no `from sglang.srt.utils import ...` to add {SM} to")
        return cst_tools.with_imported_name(module, source, SM, ("get_device_memory_capacity",))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        method = _post_init(module)
        body = list(cst_tools.function_body(method))
        refusals = _refusals(method)
        if len(refusals) != 1:
            raise PostconditionFailed(f"{len(refusals)} refusals of the fusion flag, expected one")
        if body.index(refusals[0]) > body.index(_adjustments(method)):
            raise PostconditionFailed("the refusal comes after the model-specific adjustments")
        if SM not in cst_tools.imported_names(module):
            raise PostconditionFailed(f"the refusal calls {SM}(), which the module lacks")
