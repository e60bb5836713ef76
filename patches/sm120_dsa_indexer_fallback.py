"""Send the DSA Lightning indexer on capability 12 to the release's own torch MQA-logits path.

Why: every DSA model (DeepSeek-V3.2, GLM-5, GLM-5.3-Flash, ...) scores its KV cache with the
Lightning indexer (`Indexer` in `srt/layers/attention/nsa/nsa_indexer.py`, from 0.5.13
`srt/layers/attention/dsa/dsa_indexer.py`) before any sparse-attention backend runs. On CUDA it
calls DeepGEMM: `fp8_mqa_logits` at prefill (`_get_topk_ragged`, also with prefill context
parallelism), `get_paged_mqa_logits_metadata` and `fp8_paged_mqa_logits` at decode, target-verify
and draft-extend (`_get_topk_paged`; the DSA backend precomputes the same schedule metadata), and
`get_num_sms` when the indexer is built. The DeepGEMM builds these releases install have SM90 and
SM100 kernels only: on an RTX PRO 6000, RTX 5090 or GB10 the first forward dies with "Assertion
error (csrc/apis/attention.hpp:211): Unsupported architecture" (sglang issues #26087 for GLM-5.1
on 0.5.12 and #23657 for DeepSeek-V4's indexer; DeepGEMM issues #236 and #317). So
`sm120-dsa-backends` alone does not make a DSA model run on 12.

0.5.22 added a torch path for it, behind `SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` (an `EnvBool` in
`srt/environ.py`, default False): `_use_torch_mqa_logits()` in `srt/layers/attention/dsa/utils.py`
reads it, and `resolve_num_sms`, `resolve_paged_mqa_logits_metadata_fn`,
`resolve_fp8_paged_mqa_logits_fn` and `resolve_fp8_mqa_logits_fn` then hand the indexer and the
DSA backend the device's SM count, SGLang's own JIT schedule kernel (plain CUDA with CUB, built
for the device it runs on) and two pure-torch logits functions (`_fp8_mqa_logits_torch`; the
DSv4 indexer's `fp8_paged_mqa_logits_torch`) instead of DeepGEMM. Nothing sets it for DSA models
(0.5.22's model hook sets it, with `SGLANG_OPT_USE_TILELANG_INDEXER`, for DeepSeek-V4 on
capability 12 only; that second variable is read by the DeepSeek-V4 indexer alone). The public
GLM-5.3-Flash image for 4x RTX PRO 6000 (0xSero/glm-5.3-flash-sglang-sm120, Dockerfile) sets both
by hand; sglang PR #29586 (open) proposes the same torch selection for GLM-5.2 on SM120.

This patch makes `_use_torch_mqa_logits()` answer True on CUDA capability 12 (12.0 and 12.1; not
ROCm, whose gfx1250 reports major 12 too) when the variable is not set, as 0.5.22's DeepSeek-V4
hook does for its indexer: a user who sets it to 0 (a DeepGEMM build with SM120 MQA-logits
kernels, DeepGEMM PR #324) keeps DeepGEMM. Other capabilities are untouched. The torch decode
path takes one query row per sequence; by the release's code (not run), capability 12 never
builds the two-dimensional target-verify lengths (`is_sm100` only), so speculative decoding
reaches it flattened, as on SM90.

0.5.9 - 0.5.21 have no path off DeepGEMM in the DSA indexer: there
`sm120-dsa-indexer-torch-logits` (the indexer) and `sm120-dsa-backend-torch-schedule` (the DSA
backend's schedule) rebind the `deep_gemm` name they call through to torch code of our own,
proven equal to this release's `_fp8_mqa_logits_torch` and `_fp8_paged_mqa_logits_torch` on the
inputs their call sites pass.

Not judged on 12 by this patch: the rest of the indexer's path (TileLang's `act_quant`, the
index-K cache store, the top-k transform's kernels), and the opt-in DSA K-pool (`dsa_index_kpool`
> 1), which calls DeepGEMM directly.

Delete when: a release takes the torch path (or a DeepGEMM with SM120 MQA-logits kernels) on
capability 12 by itself.
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
from sglpatch.patches.sm120_dsa_backends import DSA_ARCHITECTURES, DSA_CONFIG

FUNCTION = "_use_torch_mqa_logits"
VARIABLE = "envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
SM120_TEST = "torch.cuda.get_device_capability()[0] == 12"

# 0.5.22 added the switch; before, the indexer calls DeepGEMM with no alternative (see above).
TARGET = ByRelease(
    {
        ">=0.5.22": "srt/layers/attention/dsa/utils.py",
        "<0.5.22": None,
    }
)

BRANCH = f"""\
if (
    is_cuda()
    and {SM120_TEST}
    and not {VARIABLE}.is_set()
):
    # sglpatch: DeepGEMM's MQA-logits kernels have no capability-12 build ("Unsupported
    # architecture"); the torch path runs there (sm120-dsa-indexer-fallback)
    return True
"""


def _reads_variable(module: cst.Module, node: cst.CSTNode) -> bool:
    return f"{VARIABLE}.get()" in module.code_for_node(node)


def _imports_torch(module: cst.Module) -> bool:
    return any(
        isinstance(small, cst.Import)
        and any(module.code_for_node(alias) == "torch" for alias in small.names)
        for line in module.body
        if isinstance(line, cst.SimpleStatementLine)
        for small in line.body
    )


class Sm120DsaIndexerFallback(Patch):
    """Make `_use_torch_mqa_logits()` True on capability 12 unless the user set the variable."""

    id = "sm120-dsa-indexer-fallback"
    description = "The DSA indexer on capability 12 takes the release's torch MQA-logits path"
    symptom = (
        "DSA models on capability 12: the indexer's DeepGEMM fp8_mqa_logits / "
        "get_paged_mqa_logits_metadata fail with 'Unsupported architecture' at the first forward"
    )
    tested = TESTED
    files = TARGET
    concerns = Concerns(architectures=DSA_ARCHITECTURES, config=DSA_CONFIG)
    reads = (FUNCTION,)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = cst_tools.find_function(module, FUNCTION)
        if cst_tools.ifs_testing(module, function, SM120_TEST):
            raise AlreadyPresent(f"{FUNCTION} already answers for capability 12")
        body = cst_tools.function_body(function)
        reading = [s for s in body if _reads_variable(module, s)]
        if len(reading) != 1 or not _reads_variable(module, body[-1]):
            raise AnchorMissing(f"{FUNCTION} does not end by reading {VARIABLE}")
        if "is_cuda" not in cst_tools.imported_names(module, "sglang.srt.utils"):
            raise AnchorMissing("the module does not import is_cuda from sglang.srt.utils")
        if not _imports_torch(module):
            raise AnchorMissing("the module does not import torch")
        branch = cst_tools.statement(BRANCH, module)
        new = cst_tools.with_statements_beside(function, body[-1], [branch], after=False)
        return cst_tools.replace_statement(module, function, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        body = cst_tools.function_body(cst_tools.find_function(module, FUNCTION))
        branch = body[-2] if len(body) > 1 else None
        if not isinstance(branch, cst.If) or SM120_TEST not in module.code_for_node(branch.test):
            raise PostconditionFailed(f"{FUNCTION} does not ask about capability 12 last")
        test = module.code_for_node(branch.test)
        if "is_cuda()" not in test or f"not {VARIABLE}.is_set()" not in test:
            raise PostconditionFailed("the capability-12 answer overrides a user's choice or ROCm")
        returned = [
            module.code_for_node(r.value)
            for r in cst_tools.walk(branch.body, cst.Return)
            if r.value is not None
        ]
        if returned != ["True"] or branch.orelse is not None:
            raise PostconditionFailed("capability 12 is not sent to the torch path")
        if not _reads_variable(module, body[-1]):
            raise PostconditionFailed(f"other capabilities no longer read {VARIABLE}")
