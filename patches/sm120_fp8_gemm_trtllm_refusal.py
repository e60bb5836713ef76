"""Refuse `--fp8-gemm-backend flashinfer_trtllm` on capability 12 when the backend is chosen.

Why: from 0.5.6.post2 to 0.5.9, `_dispatch_explicit_backend` in `fp8_utils.py` admits the asked
`flashinfer_trtllm` backend when `is_blackwell_supported() and is_flashinfer_available()`, and
`is_blackwell_supported()` is true for majors 10 and 12 (`utils/common.py`). So on an RTX PRO 6000,
RTX 5090 or GB10 it returns `flashinfer_gemm_w8a8_block_fp8_linear_with_fallback`, whose block-FP8
linear calls FlashInfer's `gemm_fp8_nt_groupwise(..., backend="trtllm")`: trtllm-gen, SM100/SM103
only. The first forward pass then fails inside FlashInfer (a ValueError "gemm_fp8_nt_groupwise is
only supported on SM100, SM103 in trtllm backend" in flashinfer-ai/flashinfer issue #2216, from RTX
5090s on SGLang; later FlashInfers word it "BackendSupportedError: ... does not support backend
'trtllm' with capability 120", kvcache-ai/ktransformers issue #1889). The same arm is reached with
the flag left at `auto` and the deprecated `SGLANG_ENABLE_FLASHINFER_FP8_GEMM=1`, which
`initialize_fp8_gemm_config` turns into `flashinfer_trtllm` (an environment variable: `concerns`
names the flag alone).

What upstream did: 0.5.10 tests `is_sm100_supported()` in that arm ("FlashInfer TRTLLM FP8 GEMM
requires SM100/SM103 GPUs and FlashInfer."), the release that also first has the
`flashinfer_cutlass` arm (FlashInfer's groupwise GEMM with `backend="cutlass"`, which has SM120
kernels) and Triton as capability 12's automatic choice: sgl-project/sglang PR #19721 ("Various
SM120 improvements") describes exactly those two changes (its diff was not read here); 0.5.18 still
calls `is_sm100_supported()` there, 0.5.19+ ask `get_platform().is_sm100`. This patch makes the
same change in the `flashinfer_trtllm` arm alone (the CUTLASS and other arms keep their own tests),
takes 0.5.10's message, and adds `is_sm100_supported` to the `sglang.srt.utils` import where the
module lacks it (0.5.6.post2 - 0.5.8.post1; 0.5.9 imports it).

What the user gets: a RuntimeError naming the flag and SM100/SM103 when the first block-FP8 linear
layer is built (`Fp8LinearMethod.__init__` asks the dispatcher, before any weight is loaded),
instead of a failure inside the kernel at the first forward pass. It does not make
`flashinfer_trtllm` run on 12: the working choices there are `auto` and `triton` (the automatic
choice is `sm120-fp8-block-gemm-triton`'s, in another function of the same file). 10.0 is served
as before; 8.9 and 9.0 are refused as before, in 0.5.10's words. Releases before 0.5.6.post2 have
no `--fp8-gemm-backend` and are not for this patch: there FlashInfer's FP8 GEMM is an environment
variable read at import time (`SGLANG_ENABLE_FLASHINFER_GEMM`, from 0.5.5.post3
`SGLANG_ENABLE_FLASHINFER_FP8_GEMM`), gated by `is_sm100_supported()` up to 0.5.4.post1 but by
`is_blackwell_supported()` from 0.5.4.post2, so that variable set on 12 reaches the same kernel
there; a module-level gate, another anchor, not mended here.

Sources: SGLang 0.5.6.post2 - 0.5.10 `layers/quantization/fp8_utils.py` and `utils/common.py` (read
in the wheels); flashinfer-ai/flashinfer `flashinfer/gemm.py` `gemm_fp8_nt_groupwise` (`backend ==
"trtllm"` requires SM 100 or 103; PR #1535, "Add sm check for sm100 only cutlass/trtllm kernel")
and the kernel-support table's `fp8:flashinfer_trtllm` row (trtllm-gen GEMM: major 10 only). SGLang
pins flashinfer-python 0.5.3 (0.5.6.post2, 0.5.7), 0.6.1 (0.5.8.x) and 0.6.3 (0.5.9).

Delete when: the oldest release in use is 0.5.10 or newer.
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

FUNCTION = "_dispatch_explicit_backend"
# 0.5.6.post2 - 0.5.8.post1 name the arm's test `is_flashinfer`, 0.5.9+ `is_flashinfer_trtllm`.
ARM_TESTS = ("is_flashinfer", "is_flashinfer_trtllm")
LOOSE = "is_blackwell_supported"  # majors 10 and 12
PROBE = "is_sm100_supported"
# 0.5.19+ ask `get_platform().is_sm100`; some modules cache the probe as `_is_sm100_supported`.
SM100_NAMES = (PROBE, "_is_sm100_supported")
UTILS = "sglang.srt.utils"
OLD_TAIL = "FlashInfer FP8 GEMM requires Blackwell GPUs and FlashInfer to be installed."
NEW_TAIL = "FlashInfer TRTLLM FP8 GEMM requires SM100/SM103 GPUs and FlashInfer."  # 0.5.10's

# 0.5.6.post2 introduced `--fp8-gemm-backend` and this dispatcher; 0.5.10+ read as upstream's.
FP8_UTILS = ByRelease({">=0.5.6.post2": "srt/layers/quantization/fp8_utils.py"})


def _is_arm(branch: cst.If) -> bool:
    """`if backend.is_flashinfer():` / `if backend.is_flashinfer_trtllm():`."""
    test = branch.test
    return (
        isinstance(test, cst.Call)
        and not test.args
        and isinstance(test.func, cst.Attribute)
        and isinstance(test.func.value, cst.Name)
        and test.func.value.value == "backend"
        and test.func.attr.value in ARM_TESTS
    )


def _guard(module: cst.Module) -> cst.If:
    """The `if not (...): raise RuntimeError(...)` at the top of the flashinfer_trtllm arm."""
    function = cst_tools.find_function(module, FUNCTION)
    arms = [
        branch
        for statement in cst_tools.function_body(function)
        if isinstance(statement, cst.If)
        for branch in cst_tools.if_chain(statement)
        if _is_arm(branch)
    ]
    if len(arms) != 1:
        raise AnchorMissing(f"{FUNCTION} has {len(arms)} flashinfer_trtllm arms, expected one")
    if not isinstance(arms[0].body, cst.IndentedBlock):
        raise AnchorMissing("the flashinfer_trtllm arm has no indented body")
    guards = [
        s
        for s in arms[0].body.body
        if isinstance(s, cst.If)
        and isinstance(s.test, cst.UnaryOperation)
        and isinstance(s.test.operator, cst.Not)
        and any(
            isinstance(r.exc, cst.Call)
            and isinstance(r.exc.func, cst.Name)
            and r.exc.func.value == "RuntimeError"
            for r in cst_tools.walk(s.body, cst.Raise)
        )
    ]
    if len(guards) != 1:
        raise AnchorMissing(f"the flashinfer_trtllm arm has {len(guards)} guards, expected one")
    return guards[0]


def _calls(node: cst.CSTNode, names: tuple[str, ...]) -> list[cst.Call]:
    return [
        c
        for c in cst_tools.walk(node, cst.Call)
        if isinstance(c.func, cst.Name) and c.func.value in names
    ]


def _tests_sm100(guard: cst.If) -> bool:
    """The guard's condition asks for SM100 (`is_sm100_supported()`, its cached value, or
    `get_platform().is_sm100`) and no longer for any Blackwell."""
    names = {n.value for n in cst_tools.walk(guard.test, cst.Name)}
    attributes = {a.attr.value for a in cst_tools.walk(guard.test, cst.Attribute)}
    sm100 = bool(names & set(SM100_NAMES)) or "is_sm100" in attributes
    return sm100 and LOOSE not in names and "is_blackwell" not in attributes


def _with_new_tail(module: cst.Module) -> cst.Module:
    """The module whose guard message names SM100/SM103, as 0.5.10's does (unchanged where it
    is worded otherwise: the message is a courtesy, the test is the fix)."""
    for string in list(cst_tools.walk(_guard(module).body, cst.SimpleString)):
        if string.evaluated_value == OLD_TAIL:
            value = f"{string.prefix}{string.quote}{NEW_TAIL}{string.quote}"
            module = cst_tools.replace(module, string, string.with_changes(value=value))
    return module


class Sm120Fp8GemmTrtllmRefusal(Patch):
    """The flashinfer_trtllm arm of the FP8 GEMM dispatcher asks for SM100, as 0.5.10's does."""

    id = "sm120-fp8-gemm-trtllm-refusal"
    description = "--fp8-gemm-backend flashinfer_trtllm on capability 12: a RuntimeError at load"
    symptom = (
        "--fp8-gemm-backend flashinfer_trtllm fails in the first forward pass: "
        "gemm_fp8_nt_groupwise is only supported on SM100, SM103 in trtllm backend"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = FP8_UTILS
    concerns = Concerns(
        quantization=("fp8", "compressed-tensors"), flag="--fp8-gemm-backend flashinfer_trtllm"
    )
    reads = (FUNCTION,)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        guard = _guard(module)
        if _tests_sm100(guard):
            raise AlreadyPresent("the flashinfer_trtllm arm already asks for SM100")
        loose = _calls(guard.test, (LOOSE,))
        if len(loose) != 1:
            raise AnchorMissing(f"the flashinfer_trtllm guard calls {LOOSE}() {len(loose)} times")
        strict = loose[0].with_changes(func=cst.Name(PROBE))
        module = _with_new_tail(cst_tools.replace(module, loose[0], strict))
        return cst_tools.with_imported_name(module, UTILS, PROBE, after=("is_sm90_supported",))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        guard = _guard(module)
        if not _tests_sm100(guard):
            raise PostconditionFailed("the flashinfer_trtllm arm still admits capability 12")
        # 0.5.19+ ask get_platform() instead: nothing to import there
        if _calls(guard.test, (PROBE,)) and PROBE not in cst_tools.imported_names(module, UTILS):
            raise PostconditionFailed(f"{PROBE} is called but not imported from {UTILS}")
