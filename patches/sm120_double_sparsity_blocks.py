"""Give capability 12 Triton double-sparsity extend block sizes that fit its shared memory.

Why: with `--enable-double-sparsity` every prefill runs the Triton extend kernel of
`triton_ops/double_sparsity_attention.py`. Its launcher `extend_attention_fwd` picks
BLOCK_M/BLOCK_N by capability, and capability 12 falls into the Hopper branch (`CUDA_CAPABILITY[0]
>= 9`). Hopper and B200 have about 228 KB of shared memory per block; Blackwell workstation parts
(RTX PRO 6000, RTX 5090, GB10) have 99 KB (101376 bytes). Compiled for sm_120 (by hand for sm_121
too: the same figures) with the launcher's own constexprs, warps and stages
(tests/patches/test_sm120_double_sparsity_blocks.py; every head size from 16 to 528 in steps of 16
by hand), Hopper's sizes need 114688 bytes at head sizes 129 to 256 (256: Gemma 1's and Gemma 2
9B's head size) and 102400 from 257 to 512, where the `>= 8` branch's (32, 64) overflows too; so
the first prefill dies with `OutOfResources: shared memory`. Up to 128 (49152), at 192 (98304) and
at 288 (88064) they fit: the launcher splits those two into a power of two and a small rope part.

The fix is the branch upstream gave the sibling extend kernel in 0.5.9 (sm120-extend-attention-
blocks): `CUDA_CAPABILITY[0] == 12` ahead of the Hopper branch, with (64, 128) up to head size
128, (64, 64) up to 256, (32, 32) above. Measured on this kernel for sm_120: at most 65536 bytes up
to 128, 73728 up to 256, 67584 up to 512 (71680 at MLA's 576/512, which the launcher admits but
the double-sparsity KV pool never reaches: MLA models get the MLA pool). Above 512 nothing fits
either way (133120 bytes patched); no model with such heads is known. Every other capability, and
ROCm, chooses as before.

Upstream never fixed it: the file is the same from 0.5.3.post2 to 0.5.10.post1 (0.5.3 and
0.5.3.post1 differ only in how they import the server arguments), and 0.5.11 deleted double
sparsity altogether (sgl-project/sglang#23009, "Remove deprecated double sparsity feature"), so
from 0.5.11 this patch is not for the release.

Delete when: the oldest release in use is 0.5.11 or newer.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import TESTED, AnchorMissing, ByRelease, Concerns, Patch, cst, cst_tools
from sglpatch.patches.sm120_extend_attention_blocks import insert_branch, require_branch

# 0.5.11 removed double sparsity (the backend, this kernel and its start-up options).
FILE = ByRelease({"<0.5.11": "srt/layers/attention/triton_ops/double_sparsity_attention.py"})
LAUNCHER = "extend_attention_fwd"
# Unpatched, the kernel overflows sm_120's shared memory at every head size above 128 up to 512
# but 192 and 288 (the launcher pads the others to a power of two; measured in steps of 16).
# Above 512 the patch does not make it fit.
OVERFLOWING = tuple(h for h in range(129, 513) if h not in (192, 288))


class Sm120DoubleSparsityBlocks(Patch):
    """Insert the capability-12 branch ahead of the Hopper branch of double sparsity's launcher.

    The edit and its proof are sm120-extend-attention-blocks'; only the file and the function
    that chooses differ.
    """

    id = "sm120-double-sparsity-blocks"
    description = "Triton double-sparsity extend block sizes that fit capability 12's shared memory"
    symptom = (
        "double-sparsity attention's first prefill dies with OutOfResources: shared memory, "
        "Required: 114688, Hardware limit: 101376 (head size 256)"
    )
    tested = TESTED
    files = FILE
    reads = (LAUNCHER,)  # not the decode kernels and the extend kernel, most of the file
    concerns = Concerns(
        flag="--enable-double-sparsity",
        head_sizes=OVERFLOWING,
        condition="with an attention head size above 128 (but 192 and 288), such as 256",
    )

    def _launcher(self, module: cst.Module, release: Version) -> cst.FunctionDef:
        if FILE.get(release) is None:
            raise AnchorMissing(f"{release} has no double-sparsity attention")
        return cst_tools.find_function(module, LAUNCHER)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        return insert_branch(module, self._launcher(module, release))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        require_branch(module, self._launcher(module, release))
