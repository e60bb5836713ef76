"""Auto-enable FlashInfer's all-reduce fusion on SM90/SM100 only, not on capability 12 (0.5.8).

Why: `ServerArgs._handle_model_specific_adjustments` switches `enable_flashinfer_allreduce_fusion`
on by itself for some MoE models on one node (no DP attention). Its capability gate counts 12 in:
- 0.5.4.post2 - 0.5.6.post2, GPT-OSS: `if is_blackwell_supported():`, which from 0.5.4.post2 holds
  for majors 10 and 12 (0.5.3 - 0.5.4.post1 asked `is_sm100_supported()`; the DeepSeek-V3 branch
  of these releases still does, and is left alone);
- 0.5.7, GPT-OSS, DeepSeek-V3, GLM-4.5 (`Glm4MoeForCausalLM`) and Qwen3-MoE:
  `(is_sm90_supported() or is_blackwell_supported())` ("supports SM90/100/120", it says).
At TP > 1 the MLP's all-reduce is then left to the next layer's fused
`flashinfer_allreduce_residual_rmsnorm` (`should_fuse_mlp_allreduce_with_next_layer` of
`LayerCommunicator` has no capability test in these releases; 0.5.8 added one), whose first call
builds FlashInfer's `trtllm_comm` JIT module. `gen_trtllm_comm_module` (flashinfer/jit/comm.py)
asks for `supported_major_versions=[9, 10]` in every FlashInfer these releases pin (0.4.1, 0.5.0,
0.5.2, 0.5.3), and `CompilationContext.get_nvcc_flags_list` (flashinfer/compilation_context.py)
raises when none of the GPU's architectures is left: an RTX PRO 6000, RTX 5090 or GB10 dies in
CUDA graph capture with "Capture cuda graph failed: No supported CUDA architectures found for
major versions [9, 10]."
At TP 1 the fused op never builds the module (world size 1), so nothing fails.

SGLang 0.5.8 (PR #16283, fixing issue #15650) narrowed the gate to `(is_sm90_supported() or
is_sm100_supported())`. This patch makes the same change to the predicate in every auto-enable
gate that asks `is_blackwell_supported()`: 12 no longer turns the fusion on, as in 0.5.8, and
keeps the release's ordinary all-reduce (sgl-kernel's custom all-reduce, or NCCL: not judged
here whether the sgl-kernel these releases pin carries that kernel for sm_120 and sm_121; doctor's
kernel check of the installed wheel answers it); 8.9, 9.0 and
10.0 decide exactly as before (0.5.7's SM90 arm is kept; 0.5.4.post2 - 0.5.6.post2's GPT-OSS
branch never had one, and 0.5.8's SM90 auto-enable is not backported there). A user who asks for
the fusion with `--enable-flashinfer-allreduce-fusion` still gets it: that is the concern of
`sm120-allreduce-fusion-refusal`.

From 0.5.8 to 0.5.13 the gate is upstream's ("already upstream"); 0.5.14 replaced the flag by
`--flashinfer-allreduce-fusion-backend`, whose auto-enable asks SM90/SM100 too (not for this
release).

Sources: sgl-project/sglang issue #15650 ("TRT AllReduce Fusion auto-enables on SM120 but
flashinfer only supports SM90/SM100"), PR #14764 (the 0.5.7 auto-enable), PR #15766 (a first,
closed fix) and PR #16283 (merged, 0.5.8); flashinfer-ai/flashinfer flashinfer/jit/comm.py
`gen_trtllm_comm_module` ([9, 10] at v0.4.0 - v0.6.15.post1; [9, 10, 12] from v0.6.17, PR #3903).
These releases have no flag to turn the fusion off (0.5.14 added
`--enforce-disable-flashinfer-allreduce-fusion`); without sglpatch only a start-up it skips helps
(`--tp 1`, or DP attention).

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

# 0.5.14 replaced the flag by --flashinfer-allreduce-fusion-backend (its gate asks SM90/SM100).
TARGET = ByRelease({"<0.5.4.post2": None, ">=0.5.4.post2,<0.5.14": "srt/server_args.py"})
METHOD = "_handle_model_specific_adjustments"
FLAG = "enable_flashinfer_allreduce_fusion"
BLACKWELL = {"is_blackwell_supported", "is_blackwell"}  # majors 10 and 12 in these releases
SM100 = "is_sm100_supported"
DATACENTER = {SM100, "is_sm90_supported"}
ARCHITECTURES = (
    "GptOssForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeForCausalLM",
    "Qwen3MoeForCausalLM",
)


def _enables(line: cst.SimpleStatementLine) -> bool:
    """`self.enable_flashinfer_allreduce_fusion = True`."""
    return any(
        isinstance(small, cst.Assign)
        and isinstance(small.value, cst.Name)
        and small.value.value == "True"
        and any(
            isinstance(t.target, cst.Attribute)
            and isinstance(t.target.value, cst.Name)
            and t.target.value.value == "self"
            and t.target.attr.value == FLAG
            for t in small.targets
        )
        for small in line.body
    )


def _sites(node: cst.CSTNode, gates: tuple[cst.If, ...] = ()) -> list[tuple[cst.If, ...]]:
    """For each statement that turns the fusion on, the `if`s whose body holds it (an `elif`'s
    earlier branches, which must be false to reach it, are not its gates)."""
    if isinstance(node, cst.SimpleStatementLine):
        return [gates] if _enables(node) else []
    if isinstance(node, cst.If):
        found = _sites(node.body, (*gates, node))
        return found + (_sites(node.orelse, gates) if node.orelse is not None else [])
    # Statements lie in blocks alone: expressions are never descended into.
    blocks = (cst.BaseStatement, cst.BaseSuite, cst.Else, cst.ExceptHandler, cst.Finally)
    return [s for child in node.children if isinstance(child, blocks) for s in _sites(child, gates)]


def _calls(site: tuple[cst.If, ...], names: set[str]) -> list[cst.Call]:
    """Argument-less calls of `names` in the conditions of a site's gates."""
    return [
        call
        for gate in site
        for call in cst_tools.walk(gate.test, cst.Call)
        if isinstance(call.func, cst.Name) and call.func.value in names and not call.args
    ]


def _auto_enable(module: cst.Module) -> list[tuple[cst.If, ...]]:
    server_args = cst_tools.find_class(module, "ServerArgs")
    method = cst_tools.methods(server_args).get(METHOD)
    if method is None:
        raise AnchorMissing(f"ServerArgs has no {METHOD}")
    sites = _sites(method)
    if not sites:
        raise AnchorMissing(f"{METHOD} never sets self.{FLAG} = True")
    return sites


class Sm120AllreduceFusionAutoGate(Patch):
    """Auto-enable FlashInfer all-reduce fusion under `is_sm100_supported()`, not Blackwell."""

    id = "sm120-allreduce-fusion-auto-gate"
    description = "FlashInfer all-reduce fusion is auto-enabled on SM90/SM100 only, as in 0.5.8"
    symptom = (
        "GPT-OSS (and on 0.5.7 DeepSeek-V3, GLM-4.5, Qwen3-MoE) at TP > 1 dies in CUDA graph "
        "capture: No supported CUDA architectures found for major versions [9, 10]"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.8")
    files = TARGET
    concerns = Concerns(architectures=ARCHITECTURES)
    reads = (f"ServerArgs.{METHOD}",)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        sites = _auto_enable(module)
        blackwell = [call for site in sites for call in _calls(site, BLACKWELL)]
        if not blackwell:
            if all(_calls(site, DATACENTER) for site in sites):
                raise AlreadyPresent("the fusion is auto-enabled on SM90/SM100 only")
            raise AnchorMissing("an auto-enable of the fusion has no capability gate")
        if SM100 not in cst_tools.imported_names(module):
            raise AnchorMissing(f"the module does not import {SM100}")
        for call in blackwell:
            func = call.func
            if isinstance(func, cst.Name):  # always: `_calls` keeps plain names
                module = cst_tools.replace(
                    module, call, call.with_changes(func=func.with_changes(value=SM100))
                )
        return module

    def postcondition(self, module: cst.Module, release: Version) -> None:
        for site in _auto_enable(module):
            if _calls(site, BLACKWELL):
                raise PostconditionFailed("the fusion is still auto-enabled on every Blackwell")
            if not _calls(site, DATACENTER):
                raise PostconditionFailed("an auto-enable of the fusion has no SM90/SM100 gate")
