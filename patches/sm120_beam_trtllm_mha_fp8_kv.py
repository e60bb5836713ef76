"""Keep Beam on capability 12 off `trtllm_mha` when its KV cache is FP8 (0.5.23).

Why: SGLang 0.5.23's Beam override (`arg_groups/model_overrides/beam.py`, `BeamForCausalLM`)
gives `trtllm_mha` to SM90, SM100 and SM120 alike when no attention backend is given. On
capability 12 that backend prefills with FlashInfer's TRT-LLM fmha_v2 kernels
(`flashinfer.prefill.trtllm_fmha_v2_prefill`; decode is XQA) and, with an FP8 KV cache, casts
the query to FP8 first (`forward_extend`). fmha_v2 has no FP8 (e4m3) kernel for SM120: FlashInfer
raises "FP8 (e4m3) is not yet supported for FMHAv2 on SM120", and the release's own start-up
check (`arg_groups/attention_hook.py`) refuses the combination first. So an RTX PRO 6000, RTX 5090
or GB10 serving Beam with `--kv-cache-dtype fp8_e4m3` stops at start-up with "TRTLLM FMHAv2
prefill on SM120 does not support fp8_e4m3 KV cache or skip-softmax", and with a checkpoint that
declares an FP8 KV cache (`kv_cache_quant_algo: FP8`, or a float 8-bit `kv_cache_scheme`, which
`--kv-cache-dtype auto` turns into float8_e4m3fn at load) it passes that check and fails at the
first prefill inside FlashInfer.

This patch gives the override's SM120 term one more condition: capability 12 takes `trtllm_mha`
only when the KV cache is not FP8 (neither asked for nor declared by the checkpoint in those two
forms). With an FP8 KV cache the override leaves the backend unset, and 12 gets the release's own
default for MHA models: FlashInfer (Triton without it). FlashInfer is the release's own FP8 KV
prefill path off SM100 (`kv_cache_hook.py` sends NVFP4 KV caches there to an FP8 E4M3 workspace
prefilled by `flashinfer`); this project has not run it on a GPU. A 16-bit KV cache keeps
upstream's `trtllm_mha` on 12; 8.9, 9.0 and 10.0 choose as before.

Not here: the MiniMax-M3.1 NVFP4 override's `is_blackwell` branch (same release) also sends 12 to
`trtllm_mha`, with a forced FP8 KV cache, but the same branch also chooses MoE kernels 12 has no
build of (MegaMoE with DeepGEMM, or FlashInfer TRT-LLM routed experts, which the release's NVFP4
expert method requires whenever `is_blackwell` holds), and its other branch gives fa3, so
narrowing the attention choice there alone does not make it run; this patch leaves it alone.

Sources: sgl-project/sglang PR #23112 ("Add fmha_v2 attention backend for SM90/120"; its review
notes that FlashInfer 0.6.17 rejects E4M3 queries in FMHAv2 on SM120, flashinfer/prefill.py
trtllm_fmha_v2_prefill); flashinfer-ai/flashinfer PR #4458 (the SM120 e4m3 FMHAv2 gates: the
paged layouts SGLang uses have no sm120 e4m3 kernel) and issue #2555 (SM120 fmha_v2 wiring);
triage hunk `6b1efa3cfd` (0.5.23 beam.py). The workaround without sglpatch is
`--attention-backend flashinfer` (or triton).

What is judged: the start-up choice, on the release's own override and check. Not judged: that
FlashInfer's prefill with an FP8 KV cache runs on a 12.0 or 12.1 GPU; the release itself sends
FP8-KV prefill off SM100 there (`kv_cache_hook.py`), and no GPU run backs it.

Delete when: a release's Beam override checks the KV-cache dtype before giving 12 trtllm_mha, or
FlashInfer ships FP8 fmha_v2 prefill kernels for SM120 and SGLang drops its refusal (none has as
of 0.5.23).
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

OVERRIDE = ByRelease({">=0.5.23": "srt/arg_groups/model_overrides/beam.py"})
FUNCTION = "_beam_overrides"
BACKEND = "trtllm_mha"
SM120 = "is_sm120"
FP8_KV = "sglpatch_fp8_kv"

# Whether the KV cache will be FP8 (e4m3): asked for, or declared by the checkpoint in the two
# forms `--kv-cache-dtype auto` reads as FP8 (mem_cache/kv_cache_dtype.py, modelopt_quant.py).
FP8_KV_CACHE = """\
# sglpatch: on SM120 trtllm_mha prefills with FlashInfer's fmha_v2, which has no FP8 (e4m3)
# kernel there; with an FP8 KV cache 12 keeps the release's default backend.
sglpatch_kv_quant = getattr(hf_config, "quantization_config", None) or {}
sglpatch_kv_scheme = sglpatch_kv_quant.get("kv_cache_scheme")
sglpatch_fp8_kv = cfg.kv_cache_dtype == "fp8_e4m3" or (
    cfg.kv_cache_dtype == "auto"
    and (
        str(sglpatch_kv_quant.get("kv_cache_quant_algo") or "").upper() == "FP8"
        or (
            isinstance(sglpatch_kv_scheme, dict)
            and sglpatch_kv_scheme.get("type") == "float"
            and sglpatch_kv_scheme.get("num_bits") == 8
        )
    )
)
"""
GATE = "(get_platform().is_sm120 and not sglpatch_fp8_kv)"


def _sets_trtllm_mha(branch: cst.If) -> bool:
    return any(s.evaluated_value == BACKEND for s in cst_tools.walk(branch.body, cst.SimpleString))


def _sm120_terms(branch: cst.If) -> list[cst.Attribute]:
    return [a for a in cst_tools.walk(branch.test, cst.Attribute) if a.attr.value == SM120]


def _guarded(branch: cst.If) -> bool:
    """Ours (`... and not sglpatch_fp8_kv`), or upstream's own look at the KV-cache dtype."""
    names = {n.value for n in cst_tools.walk(branch.test, cst.Name)}
    return FP8_KV in names or "kv_cache_dtype" in names


def _choice(module: cst.Module) -> tuple[cst.FunctionDef, cst.If]:
    """The override and its one top-level `if ...is_sm120...: ... "trtllm_mha"` statement."""
    function = cst_tools.find_function(module, FUNCTION)
    found = [
        s
        for s in cst_tools.function_body(function)
        if isinstance(s, cst.If) and _sets_trtllm_mha(s) and _sm120_terms(s)
    ]
    if len(found) != 1:
        raise AnchorMissing(
            f"expected one {FUNCTION} branch giving {BACKEND} to SM120, found {len(found)}"
        )
    return function, found[0]


class Sm120BeamTrtllmMhaFp8Kv(Patch):
    """Beam's override: capability 12 takes trtllm_mha only without an FP8 KV cache."""

    id = "sm120-beam-trtllm-mha-fp8-kv"
    description = "Beam with an FP8 KV cache: 12 keeps the default backend, not trtllm_mha"
    symptom = (
        "Beam with an FP8 KV cache stops at start-up: TRTLLM FMHAv2 prefill on SM120 does not "
        "support fp8_e4m3 KV cache (a checkpoint's FP8 KV: FlashInfer fails at the first prefill)"
    )
    tested = TESTED
    files = OVERRIDE
    concerns = Concerns(architectures=("BeamForCausalLM",))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function, branch = _choice(module)
        if _guarded(branch):
            raise AlreadyPresent(f"{FUNCTION} gives {BACKEND} to SM120 only without FP8 KV")
        terms = _sm120_terms(branch)
        if len(terms) != 1 or module.code_for_node(terms[0]) != "get_platform().is_sm120":
            raise AnchorMissing(f"the {BACKEND} branch does not test get_platform().is_sm120 once")
        parameters = {p.name.value for p in function.params.params}
        assigned = {
            t.target.value
            for a in cst_tools.walk(function, cst.Assign)
            for t in a.targets
            if isinstance(t.target, cst.Name)
        }
        if "hf_config" not in parameters or "cfg" not in assigned:
            raise AnchorMissing(f"{FUNCTION} has no hf_config parameter or cfg view")
        gate = cst.parse_expression(GATE, config=module.config_for_parsing)
        guarded = branch.deep_replace(terms[0], gate)
        if not isinstance(guarded, cst.If):
            raise AnchorMissing(f"the {BACKEND} branch did not stay an if statement")
        parsed = cst.parse_module(FP8_KV_CACHE, config=module.config_for_parsing)
        # The comment above the first statement parses as the snippet's header: keep it there.
        first, *rest = parsed.body
        added = [first.with_changes(leading_lines=[*parsed.header, *first.leading_lines]), *rest]
        body = list(cst_tools.function_body(function))
        index = body.index(branch)
        body[index : index + 1] = [*added, guarded]
        if not isinstance(function.body, cst.IndentedBlock):
            raise AnchorMissing(f"{FUNCTION} has no indented body")
        new = function.with_changes(body=function.body.with_changes(body=body))
        return cst_tools.replace(module, function, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        function, branch = _choice(module)
        body = list(cst_tools.function_body(function))
        defined = any(
            isinstance(t.target, cst.Name) and t.target.value == FP8_KV
            for s in body[: body.index(branch)]
            for a in cst_tools.walk(s, cst.Assign)
            for t in a.targets
        )
        names = {n.value for n in cst_tools.walk(branch.test, cst.Name)}
        if not (_guarded(branch) and (defined or FP8_KV not in names)):
            raise PostconditionFailed(f"{FUNCTION} still gives {BACKEND} to SM120 with FP8 KV")
