"""Let hybrid-GDN models (Qwen3-Next, Qwen3.5) start on capability 12 with FlashInfer attention.

Why: `attn_backend_wrapper` checks the attention backend of hybrid-GDN models with
`if is_blackwell(): assert attention_backend in <a short list>`. From 0.5.4.post2 `is_blackwell()`
counts capability 12, but the list holds only "triton" (0.5.4.post2 to 0.5.5.post1) or
"triton"/"trtllm_mha" (0.5.5.post2 to 0.5.9), while the backend SGLang picks by default on
capability 12 is "flashinfer". An RTX PRO 6000, RTX 5090 or GB10 therefore stops at start-up
with "AssertionError: triton ... backend(s) are the only supported backends on Blackwell GPUs for
hybrid GDN models" unless the user passes `--attention-backend triton`.

SGLang 0.5.10 admitted "flashinfer" (and "fa4") for every Blackwell part; 0.5.16 gave
capability 12 its own list, {"triton", "trtllm_mha", "flashinfer"} (no fa4: it has no SM120
kernels). This patch inserts 0.5.16's capability-12 branch in front of the release's own check,
which capability 10 and 11 keep unchanged.

Delete when: the oldest release in use is 0.5.10 or newer (0.5.10 to 0.5.15.post1 also accept
fa4 on capability 12, which 0.5.16 refuses; that is a stricter message, not a crash fix).
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

FUNCTION = "attn_backend_wrapper"
# The hybrid-GDN architectures of 0.5.4.post2 - 0.5.9 (model_runner's `hybrid_gdn_config`).
GDN_MODELS = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration",
)
HELPER = "is_sm120_supported"
# Before 0.5.4.post2 `is_blackwell()` means capability 10 only: capability 12 is never checked.
TARGET = ByRelease(
    {"<0.5.4.post2": None, ">=0.5.4.post2": "srt/layers/attention/attention_registry.py"}
)

BRANCH = """\
if is_sm120_supported():
    # Capability 12 (sglpatch: SGLang 0.5.16's list): flashinfer is its default backend;
    # fa4 has no SM120 kernels.
    allowed = {"triton", "trtllm_mha", "flashinfer"}
    assert runner.server_args.attention_backend in allowed, (
        f"Only {allowed} backends are supported on Blackwell GPUs for hybrid GDN models. "
        f"Got attention_backend={runner.server_args.attention_backend}."
    )
else:
    pass
"""


def _calls(node: cst.BaseExpression, name: str) -> bool:
    """`name()` or `<...>.name` (0.5.19's `get_platform().is_sm120`)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value == name
    return isinstance(node, cst.Attribute) and node.attr.value == name.removesuffix("_supported")


def _wrapper(module: cst.Module) -> cst.FunctionDef:
    found = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == FUNCTION]
    if len(found) != 1:
        raise AnchorMissing(f"expected one function {FUNCTION}, found {len(found)}")
    return found[0]


def _blackwell_check(wrapper: cst.FunctionDef) -> cst.If:
    found = [n for n in cst_tools.find_compound(wrapper, cst.If) if _calls(n.test, "is_blackwell")]
    if len(found) != 1:
        raise AnchorMissing(f"expected one `if is_blackwell():` in {FUNCTION}, found {len(found)}")
    return found[0]


def _sm120_branch(check: cst.If) -> cst.If | None:
    """The `if is_sm120_supported():` that opens the Blackwell check, if there is one."""
    first = check.body.body[0] if isinstance(check.body, cst.IndentedBlock) else None
    return first if isinstance(first, cst.If) and _calls(first.test, HELPER) else None


def _admits(node: cst.CSTNode, backend: str) -> bool:
    return any(s.evaluated_value == backend for s in cst_tools.walk(node, cst.SimpleString))


def _helper_import(wrapper: cst.FunctionDef) -> cst.ImportFrom:
    """The wrapper's own `from sglang.srt.utils import is_blackwell, ...`."""
    found = [
        i
        for i in cst_tools.walk(wrapper, cst.ImportFrom)
        if i.module is not None
        and cst.Module([]).code_for_node(i.module) == "sglang.srt.utils"
        and not isinstance(i.names, cst.ImportStar)
        and any(isinstance(a.name, cst.Name) and a.name.value == "is_blackwell" for a in i.names)
    ]
    if len(found) != 1:
        raise AnchorMissing(f"expected one import of is_blackwell in {FUNCTION}")
    return found[0]


def _imports_helper(node: cst.ImportFrom) -> bool:
    if isinstance(node.names, cst.ImportStar):  # _helper_import picks named imports only
        raise AnchorMissing("a star import names no helper")
    return any(isinstance(a.name, cst.Name) and a.name.value == HELPER for a in node.names)


class Sm120HybridGdnBackend(Patch):
    """Give capability 12 SGLang 0.5.16's hybrid-GDN attention backend list."""

    id = "sm120-hybrid-gdn-backend"
    description = "hybrid-GDN models on capability 12 accept FlashInfer attention (0.5.16's list)"
    symptom = (
        "Qwen3-Next/Qwen3.5 stop at start-up: AssertionError 'triton ... the only supported "
        "backends on Blackwell GPUs for hybrid GDN models'"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = TARGET
    concerns = Concerns(architectures=GDN_MODELS)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        wrapper = _wrapper(module)
        check = _blackwell_check(wrapper)
        if _sm120_branch(check) is not None:
            raise AlreadyPresent("the hybrid-GDN check has a branch for capability 12")
        if _admits(check, "flashinfer"):
            raise AlreadyUpstream("the Blackwell hybrid-GDN check already admits flashinfer")
        if not isinstance(check.body, cst.IndentedBlock):
            raise AnchorMissing("the Blackwell hybrid-GDN check has no indented body")
        importing = _helper_import(wrapper)
        template = cst_tools.statement(BRANCH, module)
        if not (isinstance(template, cst.If) and isinstance(template.orelse, cst.Else)):
            raise AnchorMissing("the capability-12 branch did not parse as an if/else statement")
        # The release's own check becomes the `else:` for every other Blackwell part.
        branch = template.with_changes(
            orelse=template.orelse.with_changes(
                body=template.orelse.body.with_changes(body=check.body.body)
            )
        )
        patched = cst_tools.replace(
            module, check, check.with_changes(body=check.body.with_changes(body=[branch]))
        )
        if _imports_helper(importing):
            return patched
        return cst_tools.replace(patched, importing, cst_tools.with_alias(importing, HELPER))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        wrapper = _wrapper(module)
        check = _blackwell_check(wrapper)
        branch = _sm120_branch(check)
        if branch is None:
            if _admits(check, "flashinfer"):
                return  # 0.5.10 to 0.5.15.post1: every Blackwell part accepts flashinfer
            raise PostconditionFailed("capability 12 has no hybrid-GDN check of its own")
        if not _admits(branch.body, "flashinfer"):
            raise PostconditionFailed("capability 12's hybrid-GDN list lacks flashinfer")
        if isinstance(branch.test, cst.Call) and not _imports_helper(_helper_import(wrapper)):
            raise PostconditionFailed(f"{FUNCTION} does not import {HELPER}")
