"""Keep capability 12 off the CuTe DSL GDN prefill kernel (tcgen05/TMEM, SM10x only).

Why: `gdn_cutedsl._is_blackwell()` returns `major >= 10`, so on capability 12 the GDN
(Qwen3-Next, Qwen3.5) backend `cutedsl` takes the ported Blackwell prefill kernel, which is
built on tcgen05/TMEM that SM120/SM121 do not have: the first prefill fails to compile. 0.5.23
renamed the helper `_is_sm10x()` and made it `major == 10`, so capability 12 gets
`supports_prefill = False` and the backend falls back to Triton for prefill (its decode path
is unchanged). This patch makes the same comparison change, keeping the helper's name.

Delete when: the oldest release in use is 0.5.23 or newer. Before 0.5.13 the CuTe DSL GDN
kernel is decode-only: no prefill, no gate.
"""

from __future__ import annotations

from typing import ClassVar

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

# The hybrid-GDN architectures of 0.5.13 - 0.5.22 (model_runner's `hybrid_gdn_config`, then the
# linear-attention model registry).
GDN_MODELS = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration",
)
KERNEL = ByRelease({">=0.5.13": "srt/layers/attention/linear/kernels/gdn_cutedsl.py"})
OURS, UPSTREAM = "_is_blackwell", "_is_sm10x"


def _function(module: cst.Module, name: str) -> cst.FunctionDef | None:
    return next(
        (s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )


def _major_test(function: cst.FunctionDef) -> cst.Comparison:
    """The helper's last statement: `return major <op> 10`."""
    body = function.body
    last = body.body[-1] if isinstance(body, cst.IndentedBlock) and body.body else None
    if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return):
        value = last.body[0].value
        if (
            isinstance(value, cst.Comparison)
            and isinstance(value.left, cst.Name)
            and value.left.value == "major"
            and len(value.comparisons) == 1
            and isinstance(value.comparisons[0].comparator, cst.Integer)
            and value.comparisons[0].comparator.value == "10"
        ):
            return value
    raise AnchorMissing(f"{function.name.value}() does not end in `return major <op> 10`")


def _only_sm10x(test: cst.Comparison) -> bool:
    return isinstance(test.comparisons[0].operator, cst.Equal)


class Sm120CutedslGdnPrefill(Patch):
    """Turn `return major >= 10` into `return major == 10` in the GDN CuTe DSL gate."""

    kernel: ClassVar[str] = "GDN"

    id = "sm120-cutedsl-gdn-prefill"
    description = "CuTe DSL GDN prefill kernel (tcgen05) only on capability 10; 12 uses Triton"
    symptom = "GDN backend cutedsl: the prefill kernel fails to build on SM120 (no tcgen05)"
    tested = TESTED
    fixed_upstream_in = Version("0.5.23")
    files = KERNEL
    concerns = Concerns(architectures=GDN_MODELS, flag="--linear-attn-backend cutedsl")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        ours = _function(module, OURS)
        if ours is None:
            upstream = _function(module, UPSTREAM)
            if upstream is not None and _only_sm10x(_major_test(upstream)):
                raise AlreadyUpstream(f"{UPSTREAM}() already admits capability 10 only")
            raise AnchorMissing(f"no {OURS}() or {UPSTREAM}() helper")
        test = _major_test(ours)
        if _only_sm10x(test):
            raise AlreadyPresent(f"{OURS}() already admits capability 10 only")
        # `major >= 10` -> `major == 10` (both spelled with single spaces upstream).
        old = test.comparisons[0]
        new_test = test.with_changes(comparisons=[old.with_changes(operator=cst.Equal())])
        return cst_tools.replace(module, test, new_test)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        helper = _function(module, OURS) or _function(module, UPSTREAM)
        if helper is None or not _only_sm10x(_major_test(helper)):
            raise PostconditionFailed(f"the CuTe DSL {self.kernel} gate still admits capability 12")
