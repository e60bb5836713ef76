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
ormandj/sglang-glm53-flash-sm120 (0011-glm53-sm120-tilelang-shared-memory). Lowered the same way
it needs 51200 B (<=16 heads per rank), 68608 B (32), 57344/76800 B with the 64-wide tail: it fits
up to 32 heads per attention rank. At 64 heads per rank it still needs 103424 B (115712 B with the
tail): that case needs a split of the heads the kernel does not have yet. The FP8-KV CUDA kernel
of 0.5.23 (25216-29312 B) and every other capability keep their shapes.

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
from sglpatch.patches.sm120_dsa_backends import DSA_ARCHITECTURES

FUNCTION = "tilelang_sparse_fwd"
V1 = "sparse_attention_fwd_kernel_v1"
FACTORIES = {"kernel_factory", "sparse_attention_fwd_kernel_v2"}  # 0.5.20+, before
SHAPE = {"block_I": 32, "num_stages": 1, "threads": 128}
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
    kernel = {v1}({arguments}, {shape})
else:
    {original}
"""


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
                and small.value.func.value in FACTORIES | {V1}
            ):
                found.append(_Build(line, small.value, small.value.func.value))
    return found


class Sm120DsaTilelangShape(Patch):
    """Build the TileLang bf16 DSA kernel as v1 with block_I=32, num_stages=1, threads=128 on 12."""

    id = "sm120-dsa-tilelang-shape"
    description = "TileLang's bf16 DSA kernel fits capability 12's 101376 B of shared memory"
    symptom = (
        "--dsa-prefill/decode-backend tilelang on capability 12: 'Failed to set the allowed "
        "dynamic shared memory size to 169984'"
    )
    tested = TESTED
    files = TARGET
    concerns = Concerns(architectures=DSA_ARCHITECTURES)
    reads = (FUNCTION, V1)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        if SM120_TEST in module.code_for_node(cst_tools.find_function(module, FUNCTION)):
            raise AlreadyPresent("tilelang_sparse_fwd already has a shape for capability 12")
        function = cst_tools.find_function(module, FUNCTION)
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
        shape = ", ".join(f"{k}={v}" for k, v in SHAPE.items())
        code = BRANCH.format(
            test=SM120_TEST,
            v1=V1,
            arguments=arguments,
            shape=shape,
            original=module.code_for_node(line.with_changes(leading_lines=())).strip(),
        )
        branch = cst_tools.statement(code, module)
        return cst_tools.replace_statement(
            module, line, branch.with_changes(leading_lines=line.leading_lines)
        )

    def postcondition(self, module: cst.Module, release: Version) -> None:
        function = cst_tools.find_function(module, FUNCTION)
        branches = cst_tools.ifs_testing(module, function, SM120_TEST)
        if len(branches) != 1:
            raise PostconditionFailed("tilelang_sparse_fwd has no shape for capability 12")
        builds = _kernel_builds(branches[0].body)
        if len(builds) != 1 or builds[0].factory != V1:
            raise PostconditionFailed(f"capability 12 does not build {V1}")
        given = {
            a.keyword.value: module.code_for_node(a.value) for a in builds[0].call.args if a.keyword
        }
        if any(given.get(k) != str(v) for k, v in SHAPE.items()):
            raise PostconditionFailed(f"capability 12's kernel shape is not {SHAPE}")
