"""Give DSA models (DeepSeek-V3.2, GLM-5.3-Flash, ...) on capability 12 the TileLang DSA backends.

Why: SGLang picks the DeepSeek sparse attention (DSA) prefill/decode backends from the KV-cache
dtype and `major` (`_dsa_split_backend_resolution` in `srt/arg_groups/overrides.py` from 0.5.15;
before, `ServerArgs._set_default_nsa_backends` in `srt/server_args.py`, `_set_default_dsa_backends`
from 0.5.13). FP8 KV (the default from capability 10, so on 12 too) gets `trtllm` for both from
0.5.10 ("trtllm" if major >= 10) and `flashmla_auto` / `flashmla_kv` in 0.5.9; a bfloat16 KV
`flashmla_sparse` and `trtllm`. trtllm-gen is built for SM100 only (FlashInfer's "TllmGenFmhaRunner
... Unsupported architecture" on an RTX PRO 6000, RTX 5090 or GB10), FlashMLA for SM90/SM100 and
FA3 for SM80-SM90. From 0.5.17 only `GlmMoeDsaForCausalLM` with an FP8 KV cache has a branch for
capability 12 (`is_glm_sm12_fp8`: `flashinfer_sparse_mla`, whose own validator refuses every other
architecture, `Glm5NextForConditionalGeneration` included). Every other DSA architecture the
release registers (DeepSeek-V3/V3.2, Kimi K2.5, Mistral Large 3, LongCat-Flash, Dots3; from 0.5.20
GLM-5.3-Flash and HYV4) fails at its first forward.

What runs on capability 12 is TileLang (sources: sglang issue #37105, "--dsa-prefill-backend
tilelang --dsa-decode-backend tilelang --kv-cache-dtype bfloat16" serving GLM-5.3-Flash on 8x RTX
PRO 6000; issues #40286 (GB10) and #39302, PR #36507's SM120 table; the public patch set
ormandj/sglang-glm53-flash-sm120). This patch adds a branch for capability 12 (CUDA, not ROCm:
gfx1250 reports major 12 too) after the ROCm one (0.5.9 has none: there it comes first): unset
prefill/decode backends become `tilelang`; the learnable-sink, GLM-FP8 and HiSparse arms before it
are left as they are. Until 0.5.22 CUDA TileLang reads a bfloat16 KV cache only (from 0.5.17
`_check_tilelang_dsa_fp8_kv` refuses FP8; before, `tilelang_sparse_fwd` has an FP8 path on ROCm
only, from 0.5.14), so there the "auto" KV dtype of these models on 12 becomes bfloat16 as well;
0.5.23 has a CUDA TileLang FP8-KV kernel (SM89+) and keeps FP8. TileLang's default bfloat16
kernel shape still needs 151552-231680 B of shared memory: `sm120-dsa-tilelang-shape` makes it
fit.

This is the attention step alone: it does not make a DSA model run on 12. Before attention, the
model's Lightning indexer scores the KV cache with DeepGEMM's `fp8_mqa_logits` /
`get_paged_mqa_logits_metadata` / `fp8_paged_mqa_logits`, which have no capability-12 build
("Unsupported architecture", sglang issue #26087). On 0.5.22+ `sm120-dsa-indexer-fallback` sends
the indexer to the release's own torch path; on 0.5.9 - 0.5.21, which have none,
`sm120-dsa-indexer-torch-logits` and `sm120-dsa-backend-torch-schedule` route those calls to
torch code proven equal to 0.5.22's on their inputs. Not judged on 12: the rest of the indexer
(TileLang's `act_quant`, the index-K cache store, the top-k kernels); none of it has been run on
a capability-12 GPU.

Before 0.5.9 (0.5.4.post2 - 0.5.8.post1) the choice is inline in
`_handle_model_specific_adjustments` and overwrites a user's backends with an FP8 KV cache: not
edited.

Delete when: a release fixes it upstream.
"""

from __future__ import annotations

from typing import NamedTuple

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

# The architectures SGLang treats as DSA models (`is_deepseek_dsa` in srt/configs/model_config.py,
# with `index_topk` in their config; `is_deepseek_nsa` before 0.5.13), across 0.5.9 - 0.5.23:
# doctor's blockers for them.
DSA_ARCHITECTURES = (
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
)
# Their DSA form only: the same classes without `index_topk` (DeepSeek-V3, GLM-4.5) take MLA.
DSA_CONFIG = ("index_topk",)
SPLIT = "_dsa_split_backend_resolution"
KV_DEFAULT = "_dsa_kv_cache_dtype_default"
FP8_BRANCH = 'kv_cache_dtype == "fp8_e4m3"'
SM120_TEST = "major == 12"
TILELANG = "tilelang"

TARGET = ByRelease(
    {
        ">=0.5.15": "srt/arg_groups/overrides.py",
        ">=0.5.9,<0.5.15": "srt/server_args.py",
        "<0.5.9": None,
    }
)


class Shape(NamedTuple):
    """Where a release picks the DSA KV dtype and backends, and how it writes them."""

    owner: str | None  # the class holding the two functions; None: module-level passes
    split: str  # picks the prefill/decode backends
    kv_default: str  # defaults the KV-cache dtype
    kv: str  # the KV-cache dtype as `kv_default` reads and sets it
    backend: str  # how `split` sets a backend ("{side}": prefill or decode)
    rocm_arm: bool  # whether the backend chain starts with ROCm's own arm


SHAPES = ByRelease(
    {
        ">=0.5.15": Shape(
            None, SPLIT, KV_DEFAULT, "kv_cache_dtype", 'declared["dsa_{side}_backend"]', True
        ),
        ">=0.5.13,<0.5.15": Shape(
            "ServerArgs",
            "_set_default_dsa_backends",
            "_set_default_dsa_kv_cache_dtype",
            "self.kv_cache_dtype",
            "self.dsa_{side}_backend",
            True,
        ),
        ">=0.5.10,<0.5.13": Shape(
            "ServerArgs",
            "_set_default_nsa_backends",
            "_set_default_nsa_kv_cache_dtype",
            "self.kv_cache_dtype",
            "self.nsa_{side}_backend",
            True,
        ),
        "==0.5.9": Shape(
            "ServerArgs",
            "_set_default_nsa_backends",
            "_set_default_nsa_kv_cache_dtype",
            "self.kv_cache_dtype",
            "self.nsa_{side}_backend",
            False,
        ),
    }
)
# The two functions of each release's shape, all the patch reads (`Patch.reads`).
READS = ByRelease(
    {
        str(spec): tuple(n if shape.owner is None else f"{shape.owner}.{n}" for n in names)
        for spec, shape in SHAPES.rows.items()
        for names in [(shape.split, shape.kv_default)]
    }
)
# Whether the release's CUDA TileLang DSA kernels read only a bfloat16 KV cache (0.5.23 added a
# CUDA FP8-KV kernel, `sparse_mla_fwd_decode_partial_fp8`, and "CUDA TileLang FP8 KV requires
# SM89 or newer").
BF16_KV_ONLY = ByRelease({"<0.5.23": True, ">=0.5.23": False})

BRANCH = """\
if major == 12 and not {hip}:
    # sglpatch: trtllm-gen (SM100), FlashMLA (SM90/SM100) and FA3 (SM80-SM90) have no kernels
    # for capability 12; TileLang's DSA kernels run there (sm120-dsa-backends)
    if not user_set_prefill:
        {prefill} = "tilelang"
    if not user_set_decode:
        {decode} = "tilelang"
"""

KV_BRANCH = """\
if major == 12 and not {hip}{glm}:
    # sglpatch: capability 12 gets TileLang, whose CUDA kernels read a bfloat16 KV cache here
    {kv} = "bfloat16"
"""


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node)


def _shape(release: Version) -> Shape:
    shape = SHAPES.get(release)
    if shape is None:
        raise AnchorMissing(f"no DSA backend choice known for {release}")
    return shape


def _function(module: cst.Module, shape: Shape, name: str) -> cst.FunctionDef:
    if shape.owner is None:
        return cst_tools.find_function(module, name)
    found = cst_tools.methods(cst_tools.find_class(module, shape.owner)).get(name)
    if found is None:
        raise AnchorMissing(f"{shape.owner} has no method {name}")
    return found


def _backend_chain(module: cst.Module, shape: Shape) -> cst.If:
    """The if/elif chain of the backend choice that goes on to the FP8 and bfloat16 defaults,
    starting with ROCm's arm where the release has one."""
    function = _function(module, shape, shape.split)
    branches = cst_tools.find_compound(function, cst.If)
    elifs = {id(b.orelse) for b in branches if isinstance(b.orelse, cst.If)}
    heads = [
        branch
        for branch in branches
        if id(branch) not in elifs
        and (not shape.rocm_arm or "is_hip" in _code(module, branch.test))
        and any(_code(module, b.test) == FP8_BRANCH for b in cst_tools.if_chain(branch))
    ]
    if len(heads) != 1:
        raise AnchorMissing(f"expected one ROCm/FP8/bf16 DSA backend chain, found {len(heads)}")
    return heads[0]


def _hip(module: cst.Module, shape: Shape, test: cst.BaseExpression) -> str:
    """How the release asks "ROCm?": `is_hip()` or `get_platform().is_hip`."""
    if not shape.rocm_arm:  # no ROCm arm to read it from: the module's own `is_hip`
        utils = ("sglang.srt.utils", "sglang.srt.utils.common")
        if not any("is_hip" in cst_tools.imported_names(module, u) for u in utils):
            raise AnchorMissing("the module does not import is_hip")
        return "is_hip()"
    for call in cst_tools.walk(test, cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == "is_hip":
            return "is_hip()"
    for attribute in cst_tools.walk(test, cst.Attribute):
        if attribute.attr.value == "is_hip":
            return _code(module, attribute)
    raise AnchorMissing("the ROCm branch does not ask is_hip")


def _glm_sm12_architectures(module: cst.Module, shape: Shape) -> list[str]:
    """The architectures of the release's own capability-12 GLM branch (`is_glm_sm12_fp8`)."""
    function = _function(module, shape, shape.split)
    names: list[str] = []
    for assign in cst_tools.walk(function, cst.Assign):
        target = assign.targets[0].target
        if isinstance(target, cst.Name) and target.value == "is_glm_sm12_fp8":
            for compare in cst_tools.walk(assign.value, cst.Comparison):
                if not (isinstance(compare.left, cst.Name) and compare.left.value == "model_arch"):
                    continue
                for part in compare.comparisons:
                    if isinstance(part.comparator, cst.SimpleString):
                        names.append(part.comparator.evaluated_value)  # type: ignore[arg-type]
    return names


def _auto_kv_branch(module: cst.Module, shape: Shape) -> cst.If:
    """`if kv_cache_dtype == "auto":` (`self.kv_cache_dtype` in ServerArgs) in the KV default."""
    function = _function(module, shape, shape.kv_default)
    test = f'{shape.kv} == "auto"'
    found = [
        branch
        for branch in cst_tools.find_compound(function, cst.If)
        if _code(module, branch.test) == test
    ]
    if len(found) != 1:
        raise AnchorMissing(f"expected one `if {test}:`, found {len(found)}")
    return found[0]


def _has_sm120(module: cst.Module, branch: cst.If) -> bool:
    return any(SM120_TEST in _code(module, b.test) for b in cst_tools.if_chain(branch))


class Sm120DsaBackends(Patch):
    """Insert a capability-12 branch giving DSA models TileLang prefill and decode backends."""

    id = "sm120-dsa-backends"
    description = "DSA models on capability 12 get TileLang DSA backends, not trtllm/FlashMLA"
    symptom = (
        "DeepSeek-V3.2 / GLM-5.3-Flash and other DSA models get SM100-only trtllm (or FlashMLA) "
        'DSA backends: "TllmGenFmhaRunner ... Unsupported architecture" at the first forward'
    )
    tested = TESTED
    files = TARGET
    concerns = Concerns(architectures=DSA_ARCHITECTURES, config=DSA_CONFIG)
    reads = READS

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        shape = _shape(release)
        head = _backend_chain(module, shape)
        if _has_sm120(module, head):
            raise AlreadyPresent("the DSA backend choice has a branch for capability 12")
        hip = _hip(module, shape, head.test)
        sides = {side: shape.backend.format(side=side) for side in ("prefill", "decode")}
        branch = cst_tools.statement(BRANCH.format(hip=hip, **sides), module)
        if not isinstance(branch, cst.If):
            raise AnchorMissing("the capability-12 branch did not parse as an if statement")
        at = 1 if shape.rocm_arm else 0  # after ROCm's arm, else ahead of the FP8 default
        module = cst_tools.replace_statement(
            module, head, cst_tools.with_branch_before(head, at, branch)
        )
        if not BF16_KV_ONLY.get(release):
            return module
        auto = _auto_kv_branch(module, shape)
        if not isinstance(auto.body, cst.IndentedBlock) or not auto.body.body:
            raise AnchorMissing(f'`if {shape.kv} == "auto":` has no indented body')
        glm = _glm_sm12_architectures(module, shape)
        listed = "".join(f'"{name}", ' for name in glm).rstrip()
        clause = f" and (\n    hf_config.architectures[0] not in ({listed})\n)" if glm else ""
        kv = cst_tools.statement(KV_BRANCH.format(hip=hip, glm=clause, kv=shape.kv), module)
        body = list(auto.body.body)
        new = auto.with_changes(body=auto.body.with_changes(body=[body[0], kv, *body[1:]]))
        return cst_tools.replace_statement(module, auto, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        shape = _shape(release)
        chain = cst_tools.if_chain(_backend_chain(module, shape))
        tests = [_code(module, b.test) for b in chain]
        sm120 = next((i for i, t in enumerate(tests) if SM120_TEST in t), None)
        if sm120 is None or FP8_BRANCH not in tests or sm120 > tests.index(FP8_BRANCH):
            raise PostconditionFailed("capability 12 has no DSA branch ahead of the FP8 default")
        body = _code(module, chain[sm120].body)
        if body.count(f'"{TILELANG}"') != 2:
            raise PostconditionFailed("the capability-12 branch does not choose tilelang twice")
        if BF16_KV_ONLY.get(release) and SM120_TEST not in _code(
            module, _auto_kv_branch(module, shape)
        ):
            raise PostconditionFailed("capability 12 still defaults to an FP8 KV cache")
