"""Give capability 12 a Triton prefill (context) attention block that fits its shared memory.

Why: `context_attention_fwd` (the Triton prefill kernel without a KV prefix, used by vision
attention and by the extend kernel's reference path) takes `BLOCK = 128` on every capability above
8. Blackwell workstation parts (RTX PRO 6000, RTX 5090, GB10) have 99 KB (101376 bytes) of shared
memory per block; at head size 256 the kernel needs 163840 bytes with `BLOCK = 128`, so the launch
dies with `OutOfResources: shared memory`. With `BLOCK = 64` it needs 73728.

The branch follows the open upstream pull request (sgl-project/sglang#27962), which mirrors the
capability-12 branch 0.5.9 added to the extend kernel: `BLOCK = 64` on CUDA capability 12, every
other capability (and ROCm) unchanged. 0.5.16 moved the file to `sglang/kernels/ops/attention/`.

Delete when: an SGLang release ships its own capability-12 branch here (none up to 0.5.23 does);
the patch then reports "already upstream".
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

# 0.5.16 moved the Triton attention kernels out of srt/layers.
FILE = ByRelease(
    {
        "<0.5.16": "srt/layers/attention/triton_ops/prefill_attention.py",
        ">=0.5.16": "kernels/ops/attention/prefill_attention.py",
    }
)
LAUNCHER = "context_attention_fwd"
WIDE = "(_is_cuda or _is_hip) and CUDA_CAPABILITY[0] > 8"
CAPABILITY_12 = "CUDA_CAPABILITY[0] == 12"
# Ahead of the `> 8` branch, which becomes its `elif`.
BRANCH = """\
if _is_cuda and CUDA_CAPABILITY[0] == 12:
    # sm120/sm121 (RTX PRO 6000, RTX 5090, GB10): ~100 KB of shared memory, too little for 128
    BLOCK = 64
"""


class Sm120PrefillAttentionBlock(Patch):
    """Insert a capability-12 `BLOCK = 64` branch ahead of the `> 8` branch of the launcher."""

    id = "sm120-prefill-attention-block"
    description = "Triton prefill attention block of 64 on capability 12 (100 KB shared memory)"
    symptom = (
        "Triton prefill/vision attention dies with OutOfResources: shared memory "
        "(163840 bytes needed at head size 256, 101376 available)"
    )
    tested = TESTED
    files = FILE
    # Up to head size 128 the kernel fits as it is: (2 * BLOCK * head + BLOCK**2) * 2 bytes is
    # 98304 at BLOCK 128, head 128 (163840 at 256).
    concerns = Concerns(
        uses=("sglang.srt.layers.attention.vision",),
        condition="with a vision head size above 128",
        vision_head_above=128,
    )
    reads = (LAUNCHER,)  # not the Triton kernel above it, most of the file

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        launcher = cst_tools.find_function(module, LAUNCHER)
        if cst_tools.ifs_testing(module, launcher, CAPABILITY_12):
            raise AlreadyPresent(f"{LAUNCHER} has a branch for capability 12")
        wide = [
            i
            for i in cst_tools.ifs_testing(module, launcher, WIDE)
            if module.code_for_node(i.test) == WIDE
        ]
        if len(wide) != 1:
            raise AnchorMissing(f"expected one `if {WIDE}` in {LAUNCHER}, found {len(wide)}")
        branch = cst_tools.statement(BRANCH, module)
        if not isinstance(branch, cst.If):
            raise AnchorMissing("the capability-12 branch did not parse as an if statement")
        new = branch.with_changes(
            orelse=wide[0].with_changes(leading_lines=()), leading_lines=wide[0].leading_lines
        )
        return cst_tools.replace(module, wide[0], new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        launcher = cst_tools.find_function(module, LAUNCHER)
        for branch in cst_tools.ifs_testing(module, launcher, CAPABILITY_12):
            # Capability 12 must be caught before the `> 8` test gives it 128.
            if branch.orelse is None or not cst_tools.ifs_testing(module, branch.orelse, WIDE):
                continue
            if "BLOCK = 64" in module.code_for_node(branch.body):
                return
        raise PostconditionFailed(f"{LAUNCHER} does not give capability 12 a block of 64")
