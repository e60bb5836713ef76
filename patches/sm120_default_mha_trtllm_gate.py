"""Give the default MHA attention backend's `trtllm_mha` branch to SM100 only, as 0.5.7 does.

Why: 0.5.6.post1 added `trtllm_mha` to the default attention choice for MHA models
(`ServerArgs._handle_attention_backend_compatibility`, when `--attention-backend` is not given)
behind `is_blackwell()`, which in 0.5.6.post1 and 0.5.6.post2 holds for capability majors 10 and
12. Capability 12 therefore gets `trtllm_mha`, whose kernels in these releases are FlashInfer's
trtllm-gen FMHA (SM 10.0/10.3 only), and the same release's own check refuses it a few lines
later: every MHA model without its own default (Llama, Qwen, Mistral, ...) stops an RTX PRO 6000,
RTX 5090 or GB10 at start-up with "ValueError: TRTLLM MHA backend is only supported on Blackwell
GPUs (SM100). Please use a different backend."

SGLang 0.5.7 narrowed the gate to `is_sm100_supported()` ("trtllm_mha does not support SM120,
which will fall back to flashinfer"). This patch makes the same change to the predicate, so 12
falls through to the chain's own fallback (FlashInfer, or Triton without it) exactly as 0.5.7
sends it there; 0.5.7's further condition on speculative decoding (`speculative_algorithm is None
or speculative_eagle_topk is not None`) is not capability-12 related and is not backported, so
8.9, 9.0 and 10.0 choose as before. From 0.5.7 the file already has the narrowed gate ("already
upstream").

Sources: triage hunks `971166669e` (0.5.6.post1, the `is_blackwell()` gate) and `76a7eabd7e`
(0.5.7, upstream's fix), both in srt/server_args.py; sgl-project/sglang PR #14291 ("use
trtllm_mha as default when possible", the gate) and PR #14842 ("fix: trtllm mha attention
auto-selection on sm120", fixing issue #14814). The workaround without sglpatch is
`--attention-backend flashinfer` (or triton).

Delete when: the oldest release in use is 0.5.7 or newer.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AnchorMissing,
    ByRelease,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

# The default-attention chain moved to arg_groups/model_override_base.py in 0.5.19.
TARGET = ByRelease(
    {
        ">=0.5.6.post1,<0.5.19": "srt/server_args.py",
        ">=0.5.19": "srt/arg_groups/model_override_base.py",
    }
)
BACKEND = "trtllm_mha"
BLACKWELL = "is_blackwell"  # majors 10 and 12 in 0.5.6.post1-0.5.6.post2
SM100 = "is_sm100_supported"
SM100_GATES = {SM100, "is_sm100"}  # the helper, and get_platform().is_sm100 (0.5.19+)
BLACKWELL_GATES = {BLACKWELL, "is_blackwell_supported"}


def _gates(branch: cst.If) -> set[str]:
    names = {n.value for n in cst_tools.walk(branch.test, cst.Name)}
    attributes = {a.attr.value for a in cst_tools.walk(branch.test, cst.Attribute)}
    return names | attributes


def _mha(node: cst.If) -> bool:
    """`if not use_mla_backend:`, the MHA half of the default choice."""
    test = node.test
    return (
        isinstance(test, cst.UnaryOperation)
        and isinstance(test.operator, cst.Not)
        and isinstance(test.expression, cst.Name)
        and test.expression.value == "use_mla_backend"
    )


def _chooses(branch: cst.If, backend: str) -> bool:
    return any(s.evaluated_value == backend for s in cst_tools.walk(branch.body, cst.SimpleString))


def _trtllm_branch(module: cst.Module) -> cst.If:
    """The branch of the default MHA chain that chooses trtllm_mha (exactly one, or raise)."""
    found: list[cst.If] = []
    for mha in (b for b in cst_tools.find_compound(module, cst.If) if _mha(b)):
        body = mha.body.body if isinstance(mha.body, cst.IndentedBlock) else ()
        heads = [s for s in body if isinstance(s, cst.If)]
        for head in heads:
            found.extend(b for b in cst_tools.if_chain(head) if _chooses(b, BACKEND))
    if len(found) != 1:
        raise AnchorMissing(
            f"expected one default MHA branch choosing {BACKEND}, found {len(found)}"
        )
    return found[0]


def _renamed(module: cst.Module, test: cst.BaseExpression) -> cst.Module:
    """`module` with each `is_blackwell()` in `test` called `is_sm100_supported()`.

    Plain edits, not a `CSTTransformer` subclass: defining one at import would load libcst in
    `status` and `list`, which read the catalogue without it.
    """
    for call in list(cst_tools.walk(test, cst.Call)):
        func = call.func
        if isinstance(func, cst.Name) and func.value == BLACKWELL and not call.args:
            module = cst_tools.replace(
                module, call, call.with_changes(func=func.with_changes(value=SM100))
            )
    return module


class Sm120DefaultMhaTrtllmGate(Patch):
    """Narrow the default MHA `is_blackwell() -> trtllm_mha` branch to `is_sm100_supported()`."""

    id = "sm120-default-mha-trtllm-gate"
    description = "default MHA attention: trtllm_mha on SM100 only, 12 gets flashinfer (0.5.7)"
    symptom = (
        "every MHA model without --attention-backend stops at start-up: TRTLLM MHA backend is "
        "only supported on Blackwell GPUs (SM100)"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.7")
    files = TARGET

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        branch = _trtllm_branch(module)
        gates = _gates(branch)
        if gates & SM100_GATES and not gates & BLACKWELL_GATES:
            raise AlreadyPresent(f"the default MHA choice gives {BACKEND} to SM100 only")
        if BLACKWELL not in gates or gates & (BLACKWELL_GATES - {BLACKWELL}):
            raise AnchorMissing(f"the {BACKEND} branch is not gated on {BLACKWELL}()")
        if SM100 not in cst_tools.imported_names(module):
            raise AnchorMissing(f"the module does not import {SM100}")
        return _renamed(module, branch.test)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        gates = _gates(_trtllm_branch(module))
        if not gates & SM100_GATES or gates & BLACKWELL_GATES:
            raise PostconditionFailed(f"the default MHA choice still gives {BACKEND} beyond SM100")
