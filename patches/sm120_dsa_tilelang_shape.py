"""Build TileLang's bfloat16 DSA sparse-attention kernel on capability 12 in a shape that fits.

Why: on CUDA with a bfloat16 KV cache, `tilelang_sparse_fwd` builds
`sparse_attention_fwd_kernel_v2` (from 0.5.20 `_v1` when the model has no RoPE tail, e.g.
GLM-5.3-Flash) with its default shape: v1 block_I=64, num_stages=2, threads=256; v2 block_I=64 and
384 threads with two KV buffers. Lowered by TileLang 0.1.12 for sm_120, they ask for 151552-206848
(v1) and 170048-231680 (v2) bytes of dynamic shared memory; capability 12 has 101376 B per block,
so the first prefill dies with "Failed to set the allowed dynamic shared memory size to 169984"
(GLM-5.3-Flash at 32 heads per rank: sglang PR #36507's SM120 table, issues #40286 and #39302).
No release reduces it. 0.5.9 - 0.5.14 build an older v2 (`T.gemm(..., wg_wait=-1)`) in the same
shape: lowered by TileLang 0.1.8, their pin from 0.5.12, it asks for the same 170048-231680 B.

On capability 12 this patch builds `sparse_attention_fwd_kernel_v1` (which takes the RoPE tail as
well) with block_I=32, num_stages=1, threads=128, the shape of sglang issue #37105's working
GLM-5.3-Flash configuration on 8x RTX PRO 6000 and of the public patch set
ormandj/sglang-glm53-flash-sm120 (0011-glm53-sm120-tilelang-shared-memory), and launches it for at
most 32 query heads at a time. Lowered the same way, one launch needs 51200 B at 16 heads and
68608 B at 32 (57344 B and 76800 B with the 64-wide RoPE tail; the same with TileLang 0.1.8), and
the CUDA compiler (nvcc 13, from TileLang 0.1.12's and 0.1.8's lowering) builds it for sm_120
without spilling (136-255 registers; 0.1.8 adds 1024 B of static shared memory).

Why 32 heads a launch: v1 pads the heads to a power of two (at least 16) and, above 64, launches
one block per 64 heads (`REPLICATE_H`, `H_per_block = 64`): a fixed 64, not a parameter. In this
shape 64 heads in a block need 103424 B (115712 B with the tail), and so do 128 (two blocks of
64); they also spill 1.5-2.3 kB of registers per thread. No other shape of its parameters fits a
block of 64 well: block_I=16 does not lower at 128 or 256 threads; at 64 threads (84480 B) it
spills 7.5 kB per thread. DSA attention is MLA-style, every query head attending to the one
latent KV with its own softmax, so heads are independent: the patch adds
`_sglpatch_sm120_sparse_fwd_kernel`, which builds one kernel per slice of up to 32 heads and
joins their outputs along the head axis (at 32 heads or fewer it is the one kernel itself).
GLM-5.3-Flash on one GPU and DeepSeek-V3.2 or GLM-5 at attention TP 2 (64 heads) take two
launches, at TP 1 (128) four, each reading the selected KV rows again. The FP8-KV CUDA kernel of
0.5.23 (25216-29312 B) and every other capability keep their shapes.

A file patched by an sglpatch from before the split (v1 built inline for all heads) reports a
failure naming it: revert, then apply again.

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
from sglpatch.patches.sm120_dsa_backends import DSA_ARCHITECTURES, DSA_CONFIG

FUNCTION = "tilelang_sparse_fwd"
V1 = "sparse_attention_fwd_kernel_v1"
FACTORIES = {"kernel_factory", "sparse_attention_fwd_kernel_v2"}  # 0.5.20+, before
SHAPE = {"block_I": 32, "num_stages": 1, "threads": 128}
HEADS_PER_LAUNCH = 32
HELPER = "_sglpatch_sm120_sparse_fwd_kernel"
SM120_TEST = "torch.cuda.get_device_capability(q.device)[0] == 12"

# The kernels moved from srt/layers/attention/nsa to .../dsa in 0.5.13 (nsa/ keeps a re-export
# shim) and to sglang/kernels in 0.5.16. Before 0.5.9 nothing selects TileLang on CUDA
# (sm120-dsa-backends does not reach those releases).
TARGET = ByRelease(
    {
        ">=0.5.16": "kernels/ops/attention/dsa/tilelang_kernel.py",
        ">=0.5.13,<0.5.16": "srt/layers/attention/dsa/tilelang_kernel.py",
        ">=0.5.9,<0.5.13": "srt/layers/attention/nsa/tilelang_kernel.py",
        "<0.5.9": None,
    }
)

BRANCH = """\
if {test}:
    # sglpatch: capability 12 has 101376 B of shared memory per block; the default shape asks
    # for 151552-231680 B (sm120-dsa-tilelang-shape)
    kernel = {helper}({arguments})
else:
    {original}
"""

# Added after the dispatcher. Above 32 heads v1 takes a block of 64 (its own `H_per_block`, not a
# parameter), which needs 103424-115712 B in this shape: more heads run 32 to a launch.
HELPER_CODE = """\
def {helper}(num_heads, d_v, tail_dim, topk, **kwargs):
    # sglpatch (sm120-dsa-tilelang-shape): capability 12 has 101376 B of shared memory per
    # block. In this shape {v1} needs 68608 B for {heads} heads (76800 B
    # with the RoPE tail), but above {heads} it takes a block of 64 heads (103424-115712 B), so
    # it runs {heads} query heads at a time: they share the one KV, and each launch's output is
    # its heads' slice of the whole.
    chunks = [(h, min(h + {heads}, num_heads)) for h in range(0, num_heads, {heads})]
    kernels = [
        {v1}(
            stop - start, d_v, tail_dim, topk, **kwargs, {shape}
        )
        for start, stop in chunks
    ]
    if len(kernels) == 1:
        return kernels[0]

    def kernel(q, kv, indices):
        outs = [
            run(q[:, :, start:stop].contiguous(), kv, indices)
            for run, (start, stop) in zip(kernels, chunks)
        ]
        return torch.cat(outs, dim=2)

    return kernel
"""


def _helper_code() -> str:
    shape = ", ".join(f"{k}={v}" for k, v in SHAPE.items())
    return HELPER_CODE.format(helper=HELPER, v1=V1, heads=HEADS_PER_LAUNCH, shape=shape)


class _Build(NamedTuple):
    """One `kernel = <factory>(num_heads, d_v, tail_dim, topk, ...)` line."""

    line: cst.SimpleStatementLine
    call: cst.Call
    factory: str


def _kernel_builds(function: cst.CSTNode) -> list[_Build]:
    """The kernel builds under `function`."""
    found: list[_Build] = []
    for line in cst_tools.walk(function, cst.SimpleStatementLine):
        for small in line.body:
            if (
                isinstance(small, cst.Assign)
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == "kernel"
                and isinstance(small.value, cst.Call)
                and isinstance(small.value.func, cst.Name)
                and small.value.func.value in FACTORIES | {V1, HELPER}
            ):
                found.append(_Build(line, small.value, small.value.func.value))
    return found


def _helpers(module: cst.Module) -> list[cst.FunctionDef]:
    return [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == HELPER]


def _with_helper(module: cst.Module) -> cst.Module:
    """`module` with the helper right after the dispatcher, two blank lines apart."""
    body = list(module.body)
    at = next(
        i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == FUNCTION
    )
    helper = cst_tools.statement(_helper_code(), module)
    if not isinstance(helper, cst.FunctionDef):
        raise AnchorMissing(f"{HELPER} did not parse as a function")
    body.insert(at + 1, helper.with_changes(leading_lines=(cst.EmptyLine(), cst.EmptyLine())))
    return module.with_changes(body=body)


class Sm120DsaTilelangShape(Patch):
    """On 12, build the TileLang bf16 DSA kernel as v1 with block_I=32, num_stages=1,
    threads=128, at most 32 query heads per launch."""

    id = "sm120-dsa-tilelang-shape"
    description = "TileLang's bf16 DSA kernel fits capability 12's 101376 B of shared memory"
    symptom = (
        "--dsa-prefill/decode-backend tilelang on capability 12: 'Failed to set the allowed "
        "dynamic shared memory size to 169984'"
    )
    tested = TESTED
    files = TARGET
    # Reached through the DSA backend `tilelang` only (GLM-5 on 0.5.23 gets flashinfer_sparse_mla
    # on 12). With an FP8 KV cache TileLang builds its FP8 kernel (0.5.23; before, CUDA TileLang
    # refuses one): the bf16 kernel this patch reshapes is not built.
    concerns = Concerns(
        architectures=DSA_ARCHITECTURES,
        config=DSA_CONFIG,
        unless="--kv-cache-dtype fp8_e4m3",
        backends=(("dsa", "tilelang"),),
    )
    reads = (FUNCTION, V1, HELPER)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = cst_tools.find_function(module, FUNCTION)
        if SM120_TEST in module.code_for_node(function):
            raise AlreadyPresent("tilelang_sparse_fwd already has a shape for capability 12")
        if _helpers(module):
            raise AnchorMissing(f"the module already defines {HELPER}")
        builds = [b for b in _kernel_builds(function) if b.factory in FACTORIES]
        if len(builds) != 1:
            raise AnchorMissing(
                f"expected one bf16 sparse-attention kernel build, found {len(builds)}"
            )
        line, call = builds[0].line, builds[0].call
        positional = [a for a in call.args if a.keyword is None]
        keywords = [a for a in call.args if a.keyword is not None]
        if len(positional) != 4 or any(a.keyword and a.keyword.value in SHAPE for a in keywords):
            raise AnchorMissing("the kernel build does not take (num_heads, d_v, tail_dim, topk)")
        v1 = cst_tools.find_function(module, V1)
        parameters = {p.name.value for p in (*v1.params.params, *v1.params.kwonly_params)}
        if not set(SHAPE) <= parameters:
            raise AnchorMissing(f"{V1} takes no block_I/num_stages/threads")
        arguments = ", ".join(
            module.code_for_node(a.value)
            if a.keyword is None
            else f"{a.keyword.value}={module.code_for_node(a.value)}"
            for a in call.args
        )
        code = BRANCH.format(
            test=SM120_TEST,
            helper=HELPER,
            arguments=arguments,
            original=module.code_for_node(line.with_changes(leading_lines=())).strip(),
        )
        branch = cst_tools.statement(code, module)
        module = cst_tools.replace_statement(
            module, line, branch.with_changes(leading_lines=line.leading_lines)
        )
        return _with_helper(module)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        function = cst_tools.find_function(module, FUNCTION)
        branches = cst_tools.ifs_testing(module, function, SM120_TEST)
        if len(branches) != 1:
            raise PostconditionFailed("tilelang_sparse_fwd has no shape for capability 12")
        builds = _kernel_builds(branches[0].body)
        if len(builds) == 1 and builds[0].factory == V1:  # what sglpatch wrote before the split
            raise PostconditionFailed(
                f"capability 12 builds {V1} for all heads in one launch, an earlier sglpatch's "
                "change (it fits up to 32 heads): revert, then apply again"
            )
        if len(builds) != 1 or builds[0].factory != HELPER:
            raise PostconditionFailed(f"capability 12 does not build its kernel with {HELPER}")
        helpers = _helpers(module)
        expected = cst_tools.statement(_helper_code(), module)
        if len(helpers) != 1 or module.code_for_node(
            helpers[0].with_changes(leading_lines=())
        ) != module.code_for_node(expected):
            raise PostconditionFailed(
                f"{HELPER} does not build {V1} with {SHAPE}, {HEADS_PER_LAUNCH} heads per launch"
            )
