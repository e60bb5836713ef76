"""Give diffusion NVFP4 GEMMs on capability 12 FlashInfer's `auto` backend, not `trtllm`.

Why: the diffusion runtime's ModelOpt NVFP4 linear layers call `flashinfer.mm_fp4` with the
backend `CudaPlatformBase.get_modelopt_flashinfer_fp4_backend()` returns. From 0.5.13 to 0.5.18
that default is `"trtllm"` on every GPU, and FlashInfer's TRT-LLM FP4 GEMM runs on SM100/SM103
only: `mm_fp4` refuses it on an RTX PRO 6000 / RTX 5090 / GB10 ("does not support backend
'trtllm' with capability 120"), so an NVFP4 diffusion checkpoint dies at its first linear layer.
(Those releases also stopped preferring sgl-kernel's CUTLASS FP4 GEMM: FlashInfer's is taken
whenever it imports.) 0.5.19 made the default `"auto" if cls.is_sm120() else "trtllm"`, and
`auto` resolves to FlashInfer's SM12x NVFP4 kernel; this patch makes the same change. 0.5.10 -
0.5.12.post1 already gave capability 12 `auto` (their default was `cudnn` on capability 10 only)
and need nothing. An explicit SGLANG_DIFFUSION_FLASHINFER_FP4_GEMM_BACKEND is left as it is.

Delete when: the oldest release in use is 0.5.19 or newer.
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

TARGET = ByRelease({"<0.5.13": None, ">=0.5.13": "multimodal_gen/runtime/platforms/cuda.py"})
FIXED = Version("0.5.19")
CLASS, METHOD = "CudaPlatformBase", "get_modelopt_flashinfer_fp4_backend"
NAME = "default_backend"
# What 0.5.19 assigns, and what 0.5.13 - 0.5.18 assign.
FIXED_DEFAULT = '"auto" if cls.is_sm120() else "trtllm"'
OLD_DEFAULT = '"trtllm"'
COMMENT = "# sglpatch: FlashInfer's TRT-LLM FP4 GEMM is SM100-only (SGLang 0.5.19's default)"


def _method(module: cst.Module) -> cst.FunctionDef:
    methods = cst_tools.methods(cst_tools.find_class(module, CLASS))
    if METHOD not in methods:
        raise AnchorMissing(f"{CLASS} has no {METHOD}()")
    return methods[METHOD]


def _default(module: cst.Module, method: cst.FunctionDef) -> cst.SimpleStatementLine:
    """The method's one top-level `default_backend = ...` line."""
    found = [
        line
        for line in cst_tools.function_body(method)
        if isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Assign)
        and isinstance(line.body[0].targets[0].target, cst.Name)
        and line.body[0].targets[0].target.value == NAME
    ]
    if len(found) != 1:
        raise AnchorMissing(f"{METHOD}() assigns {NAME} {len(found)} times at its top level")
    return found[0]


def _value(module: cst.Module, line: cst.SimpleStatementLine) -> str:
    return module.code_for_node(cst.ensure_type(line.body[0], cst.Assign).value)


class Sm120DiffusionFp4GemmBackend(Patch):
    """Turn `default_backend = "trtllm"` into 0.5.19's `"auto" if cls.is_sm120() else "trtllm"`."""

    id = "sm120-diffusion-fp4-gemm-backend"
    description = "diffusion NVFP4 GEMM on capability 12: FlashInfer `auto`, not `trtllm` (0.5.19)"
    symptom = (
        "an NVFP4 diffusion model dies at its first linear layer: mm_fp4 refuses backend "
        "'trtllm' on capability 120/121"
    )
    tested = TESTED
    fixed_upstream_in = FIXED
    files = TARGET
    concerns = Concerns(quantization=("modelopt_fp4",), runtime="multimodal_gen")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        line = _default(module, _method(module))
        value = _value(module, line)
        if value == FIXED_DEFAULT:  # ours from an earlier apply, or 0.5.19's own
            raise AlreadyPresent(f"{METHOD}() already defaults to `auto` on SM12x")
        if value != OLD_DEFAULT:
            raise AnchorMissing(f"{METHOD}() defaults to {value}, not {OLD_DEFAULT}")
        assign = cst.ensure_type(line.body[0], cst.Assign)
        new = line.with_changes(
            body=[assign.with_changes(value=cst.parse_expression(FIXED_DEFAULT))],
            leading_lines=[
                *line.leading_lines,
                cst.EmptyLine(comment=cst.Comment(COMMENT)),
            ],
        )
        return cst_tools.replace(module, line, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if _value(module, _default(module, _method(module))) != FIXED_DEFAULT:
            raise PostconditionFailed(f"{METHOD}() still defaults to `trtllm` on capability 12")
