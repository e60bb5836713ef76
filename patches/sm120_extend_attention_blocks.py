"""Give capability 12 the Triton extend-attention block sizes that fit its shared memory.

Why: the Triton extend (prefill with a KV prefix) attention launcher picks BLOCK_M/BLOCK_N by
capability, and through 0.5.8.post1 capability 12 falls into the Hopper branch
(`CUDA_CAPABILITY[0] >= 9`). Hopper and B200 have about 228 KB of shared memory per block;
Blackwell workstation parts (RTX PRO 6000, RTX 5090, GB10) have 99 KB (101376 bytes). With the
Hopper sizes the kernel needs 106496 bytes at the MLA head size of Kimi K2 and DeepSeek (Lq 576,
Lv 512) and 114688 at head size 256, so the first prefill that reaches it dies with
`OutOfResources: shared memory, Required: 106496, Hardware limit: 101376`.

The fix is upstream's own, from 0.5.9: a `CUDA_CAPABILITY[0] == 12` branch ahead of the Hopper one
with the sizes upstream uses for sm86/sm89, which have the same 100 KB: (64, 128) up to head size
128, (64, 64) up to 256, (32, 32) above. 0.5.3.x chooses the sizes inline in
`extend_attention_fwd`; from 0.5.4 in `_get_block_sizes_for_extend_attention`.

Delete when: the oldest release in use is 0.5.9 or newer (there this patch reports "already
upstream" and leaves the file alone).
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
        "<0.5.16": "srt/layers/attention/triton_ops/extend_attention.py",
        ">=0.5.16": "kernels/ops/attention/extend_attention.py",
    }
)
# 0.5.4 moved the choice out of the launcher into a helper shared by both extend launchers.
CHOOSER = ByRelease(
    {
        "<0.5.4": "extend_attention_fwd",
        ">=0.5.4": "_get_block_sizes_for_extend_attention",
    }
)
HOPPER = "_is_cuda and CUDA_CAPABILITY[0] >= 9"
CAPABILITY_12 = "CUDA_CAPABILITY[0] == 12"
# The branch 0.5.9 put ahead of the Hopper one; the Hopper branch becomes its `elif`.
BRANCH = """\
if _is_cuda and CUDA_CAPABILITY[0] == 12:
    # sm120/sm121 (RTX PRO 6000, RTX 5090, GB10): ~100 KB of shared memory, as on sm86/sm89
    if Lq <= 128:
        BLOCK_M, BLOCK_N = (64, 128)
    elif Lq <= 256:
        BLOCK_M, BLOCK_N = (64, 64)
    else:
        BLOCK_M, BLOCK_N = (32, 32)
"""


def insert_branch(module: cst.Module, chooser: cst.FunctionDef) -> cst.Module:
    """`BRANCH` ahead of `chooser`'s Hopper branch (shared with sm120-double-sparsity-blocks)."""
    if cst_tools.ifs_testing(module, chooser, CAPABILITY_12):
        raise AlreadyPresent(f"{chooser.name.value} has a branch for capability 12")
    hopper = [
        i
        for i in cst_tools.ifs_testing(module, chooser, HOPPER)
        if module.code_for_node(i.test) == HOPPER
    ]
    if len(hopper) != 1:
        raise AnchorMissing(
            f"expected one `if {HOPPER}` in {chooser.name.value}, found {len(hopper)}"
        )
    branch = cst_tools.statement(BRANCH, module)
    if not isinstance(branch, cst.If):
        raise AnchorMissing("the capability-12 branch did not parse as an if statement")
    # The Hopper branch keeps its body and its own else/elif chain, now as the `elif`.
    new = branch.with_changes(
        orelse=hopper[0].with_changes(leading_lines=()), leading_lines=hopper[0].leading_lines
    )
    return cst_tools.replace(module, hopper[0], new)


def require_branch(module: cst.Module, chooser: cst.FunctionDef) -> None:
    """`chooser` gives capability 12 `BRANCH`'s sizes before the Hopper test sees it."""
    for branch in cst_tools.ifs_testing(module, chooser, CAPABILITY_12):
        # Capability 12 must be caught before the `>= 9` test sends it to Hopper's sizes.
        if branch.orelse is None:
            continue
        chain = cst_tools.ifs_testing(module, branch.orelse, HOPPER)
        if chain and "BLOCK_M, BLOCK_N = (32, 32)" in module.code_for_node(branch.body):
            return
    raise PostconditionFailed(
        f"{chooser.name.value} does not choose capability 12's block sizes before Hopper's"
    )


class Sm120ExtendAttentionBlocks(Patch):
    """Insert 0.5.9's capability-12 branch ahead of the Hopper branch of the block-size choice."""

    id = "sm120-extend-attention-blocks"
    description = "Triton extend attention block sizes that fit capability 12's shared memory"
    symptom = (
        "first prefill with the Triton backend dies with OutOfResources: shared memory, "
        "Required: 106496, Hardware limit: 101376 (Kimi K2, DeepSeek)"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.9")
    files = FILE
    reads = ByRelease({str(spec): (name,) for spec, name in CHOOSER.rows.items()})
    # Compiled for sm_120 (tests/patches/test_sm120_extend_attention_blocks.py), Hopper's sizes
    # overflow at head sizes 256 and 576 (MLA) only: 64, 128, 192 and 288 fit.
    concerns = Concerns(
        head_sizes=(256, 576), condition="with an attention head size of 256, or MLA's 576"
    )

    def _chooser(self, module: cst.Module, release: Version) -> cst.FunctionDef:
        name = CHOOSER.get(release)
        if name is None:
            raise AnchorMissing(f"no block-size chooser is known for {release}")
        return cst_tools.find_function(module, name)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        return insert_branch(module, self._chooser(module, release))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        require_branch(module, self._chooser(module, release))
