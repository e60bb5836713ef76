"""What doctor knows of SGLang's own source, as data with its sources: the device helpers and
platform probes its gates call (`KNOWN_HELPERS`, `PLATFORM`, `PROBE`), its backend flags
(`FIELD_KINDS`: which kernel-support table kind a flag's value is), and the kernel entry points
it calls (`ENTRIES`, `FLAGS`), each with the table record it is and why.

To teach doctor a new SGLang helper, add it to `KNOWN_HELPERS` (the target's own definition
overrides it where the tree has one); a new kernel entry point, to `ENTRIES` with its record.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# SGLang's own helpers, as its `srt/utils/common.py` defines them (read from the target when it
# has them: `partial(_check_cuda_device_version, device_capability_majors=[...])`).
KNOWN_HELPERS: dict[str, frozenset[int | tuple[int, int]]] = {
    "is_sm90_supported": frozenset({9}),
    "is_sm100_supported": frozenset({10}),
    "is_sm120_supported": frozenset({12}),
    "is_blackwell_supported": frozenset({10, 11, 12}),
    "is_blackwell": frozenset({10, 11, 12}),
    "is_hopper_with_cuda_12_3": frozenset({9}),
    "is_ampere_with_cuda_12_3": frozenset({8}),
    "is_sm100_or_newer": frozenset({10, 11, 12, 13}),
}
# `is_sm120()`, `is_sm121()`, `is_sm100_supported()`: the SM number in the name.
SM_NAME = re.compile(r"_?is_sm(\d{2,3})(?:_supported)?$")

# The draft models SGLang registers beside a target (DeepSeek's NextN, MTP heads, EAGLE drafts,
# DFlash drafts, Gemma 4's MTP assistant), by class name: not models a user serves.
DRAFT_CLASS = re.compile(
    r"(?:NextN|MTP|Eagle\d*|DraftModel|AssistantForCausalLM)$|^(?:Eagle\d*|DFlash)[A-Z]"
)
# The GPUs in question are NVIDIA's: SGLang's platform probes have known answers on them.
PLATFORM = {
    "is_cuda": True,
    "_is_cuda": True,
    "is_cuda_alike": True,
    "_is_cuda_alike": True,
    "is_hip": False,
    "_is_hip": False,
    "is_npu": False,
    "_is_npu": False,
    "is_xpu": False,
    "_is_xpu": False,
    "is_cpu": False,
    "_is_cpu": False,
    "is_musa": False,
    "_is_musa": False,
    "is_mps": False,  # Apple's GPUs
    "_is_mps": False,
    "is_host_cpu_x86": False,
}


# From 0.5.19 SGLang also asks `get_platform().is_sm100`: a probe that `srt/runtime_context.py`
# maps to a helper (`_PLATFORM_PROBES = {"is_sm100": "is_sm100_supported", ...}`). The table
# holds such a probe as "get_platform().is_sm100", with its helper's majors.
PROBE = "get_platform()."
# `_PLATFORM_VALUES` there: the probes that are the device's numbers, not yes/no.
PROBE_VALUES = {"device_sm": "get_device_sm", "device_capability": "get_device_capability"}


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
FIELD_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(?:nsa|dsa)_(?:prefill|decode)_backend$"), "dsa"),
    (re.compile(r"^fp8_gemm(?:_runner)?_backend$"), "gemm:fp8"),
    (re.compile(r"^fp4_gemm(?:_runner)?_backend$"), "gemm:fp4"),
    (re.compile(r"moe_runner_backend$"), "moe"),
    (re.compile(r"^(?!mm_)(?:\w+_)?(?:attention|attn)_backend$"), "attention"),
)


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
