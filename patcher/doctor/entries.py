"""What a branch of SGLang's source chooses, named as the kernel-support table names it.

A branch chooses a backend when it sets one of SGLang's backend flags to a literal
(`self.attention_backend = "fa3"`, `overrides["moe_runner_backend"] = "triton"`,
`replace(args, attention_backend="torch_native")`): `FIELDS` says which table kind a flag's
value is looked up in. It chooses a kernel when it names one of the entry points below (calls,
imports or returns it): each is data, with its table key and why it is that record. A
function or flag that turns a kernel on (`ENABLE_JIT_DEEPGEMM`) chooses it when it is true.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


class Entry(NamedTuple):
    """A kernel entry point of SGLang's or a kernel package's, as a table record."""

    kind: str  # the table's kind: attention, dsa, moe, gemm, comm
    name: str  # the table's record name
    why: str  # why the entry point is that record (what it calls)
    sglang: str | None = None  # the SGLang releases the fact holds for (None: every one)

    def holds(self, release: str | None) -> bool:
        if self.sglang is None or release is None:
            return True
        try:
            return Version(release) in SpecifierSet(self.sglang)
        except InvalidVersion:
            return True


# A backend flag's name (the last part of `self.x`, a dict key, a keyword) -> its table kind;
# GEMM flags give "fp8:" / "fp4:" records. `mm_attention_backend` (the vision tower's, with its
# own values: "triton_attn", "sdpa") is not the attention table's.
_FIELD_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(?:nsa|dsa)_(?:prefill|decode)_backend$"), "dsa"),
    (re.compile(r"^fp8_gemm(?:_runner)?_backend$"), "gemm:fp8"),
    (re.compile(r"^fp4_gemm(?:_runner)?_backend$"), "gemm:fp4"),
    (re.compile(r"moe_runner_backend$"), "moe"),
    (re.compile(r"^(?!mm_)(?:\w+_)?(?:attention|attn)_backend$"), "attention"),
)


def field_kind(name: str) -> tuple[str, str] | None:
    """(table kind, record prefix) of a backend flag's name, or None for any other name."""
    for pattern, kind in _FIELD_KINDS:
        if pattern.search(name):
            if kind.startswith("gemm:"):
                return "gemm", kind[len("gemm:") :] + ":"
            return kind, ""
    return None


# Kernel entry points SGLang calls, imports or returns, by name.
ENTRIES: dict[str, Entry] = {
    "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback": Entry(
        "gemm",
        "fp8:flashinfer_trtllm",
        "calls FlashInfer gemm_fp8_nt_groupwise(backend='trtllm') (SGLang 0.5.9 fp8_utils.py)",
        "<0.5.10",
    ),
    "deepgemm_w8a8_block_fp8_linear_with_fallback": Entry(
        "gemm", "fp8:deep_gemm", "SGLang's DeepGEMM block-FP8 linear (fp8_utils.py)"
    ),
    "triton_w8a8_block_fp8_linear": Entry(
        "gemm", "fp8:triton", "SGLang's Triton block-FP8 linear (fp8_utils.py)"
    ),
    "cutlass_w8a8_block_fp8_linear_with_fallback": Entry(
        "gemm", "fp8:cutlass", "sgl-kernel's fp8_blockwise_scaled_mm (fp8_utils.py)"
    ),
    "aiter_w8a8_block_fp8_linear": Entry("gemm", "fp8:aiter", "AMD AITER (fp8_utils.py)"),
    # FlashInfer's trtllm-gen fused MoE launchers (flashinfer/fused_moe/core.py).
    **{
        name: Entry("moe", "flashinfer_trtllm", f"FlashInfer's trtllm-gen MoE launcher {name}")
        for name in (
            "trtllm_fp4_block_scale_moe",
            "trtllm_fp4_block_scale_routed_moe",
            "trtllm_fp8_block_scale_moe",
            "trtllm_fp8_per_tensor_scale_moe",
            "trtllm_bf16_moe",
        )
    },
    # FlashInfer's trtllm-gen ragged prefill for DeepSeek MLA: trtllm-gen FMHA only.
    "trtllm_ragged_attention_deepseek": Entry(
        "attention", "trtllm_mla", "FlashInfer's trtllm-gen ragged MLA prefill"
    ),
}

# A module-level flag or a function whose truth turns a kernel on.
FLAGS: dict[str, Entry] = {
    name: Entry("gemm", "fp8:deep_gemm", f"{name} turns SGLang's DeepGEMM kernels on")
    for name in ("_compute_enable_deep_gemm", "ENABLE_JIT_DEEPGEMM")
}
# `DEEPGEMM_BLACKWELL` (true on 12 too) only picks DeepGEMM's scale format once it is on: the
# gate that matters is the one turning it on.
