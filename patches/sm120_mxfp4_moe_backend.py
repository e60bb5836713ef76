"""Send GPT-OSS MXFP4 on capability 12 to the triton_kernels MoE runner, not to trtllm-gen.

Why: when `--moe-runner-backend` is left on "auto", the GPT-OSS branch of
`ServerArgs._handle_model_specific_adjustments` picks `flashinfer_mxfp4` whenever
`is_blackwell_supported()` holds. From 0.5.4.post2 that predicate counts capability 12 as
Blackwell, but the FlashInfer MXFP4 MoE kernels it selects are trtllm-gen ones, built for SM100
only: an RTX PRO 6000, RTX 5090 or GB10 logs "Detected Blackwell and MXFP4 quantization format
... enabling FlashInfer MXFP4 MOE kernel" and then fails inside FlashInfer. (0.5.3 to 0.5.4.post1
gate the branch on `is_sm100_supported()` and never had the bug.)

SGLang 0.5.10 fixed it with a branch for capability 12 that picks `triton_kernel`
("trtllm-gen only supports SM100"). This patch inserts that branch, just ahead of the Blackwell
one so capability 12 never reaches it; every other capability takes the branch it took before.
The triton_kernels path needs the SM120 weight layout of `sm120-triton-kernels-mxfp4-block-k`
(shipped in the same 0.5.10), or it stops at `assert num_stages >= 1` instead.

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

FLAG = "is_mxfp4_quant_format"
SM120_GATES = {"is_sm120_supported", "is_sm120"}  # the helper, and get_platform().is_sm120
BLACKWELL_GATES = {"is_blackwell_supported", "is_blackwell"}

# The GPT-OSS defaults moved out of server_args.py in 0.5.15 and into their own module in 0.5.19.
TARGET = ByRelease(
    {
        "<0.5.4.post2": None,
        ">=0.5.4.post2,<0.5.15": "srt/server_args.py",
        ">=0.5.15,<0.5.19": "srt/arg_groups/overrides.py",
        ">=0.5.19": "srt/arg_groups/model_overrides/gpt_oss.py",
    }
)

BRANCH = """\
if is_sm120_supported() and is_mxfp4_quant_format:
    # trtllm-gen only supports SM100 (sglpatch: SGLang 0.5.10's branch)
    {target} = "triton_kernel"
    logger.warning(
        "Detected SM120 and MXFP4 quantization format for GPT-OSS model, "
        "enabling triton_kernel MOE kernel."
    )
"""


def _gate(branch: cst.If) -> str | None:
    """`X() and is_mxfp4_quant_format` -> "X"; `get_platform().X and ...` -> "X"."""
    test = branch.test
    if not (
        isinstance(test, cst.BooleanOperation)
        and isinstance(test.operator, cst.And)
        and isinstance(test.right, cst.Name)
        and test.right.value == FLAG
    ):
        return None
    left = test.left
    if isinstance(left, cst.Call) and isinstance(left.func, cst.Name):
        return left.func.value
    if isinstance(left, cst.Attribute):
        return left.attr.value
    return None


def _mxfp4_chain(module: cst.Module) -> cst.If:
    """The if/elif chain that picks the GPT-OSS MoE backend from the MXFP4 format.

    Through 0.5.4.post3 it stands on its own; later releases keep it under
    `if moe_runner_backend == "auto":`.
    """
    branches = cst_tools.find_compound(module, cst.If)
    elifs = {id(b.orelse) for b in branches if isinstance(b.orelse, cst.If)}
    heads = [
        b
        for b in branches
        if id(b) not in elifs and any(_gate(x) is not None for x in cst_tools.if_chain(b))
    ]
    if len(heads) != 1:
        raise AnchorMissing(f"expected one MXFP4 MoE backend choice, found {len(heads)}")
    return heads[0]


def _position(chain: list[cst.If], gates: set[str]) -> int | None:
    return next((i for i, b in enumerate(chain) if _gate(b) in gates), None)


class Sm120Mxfp4MoeBackend(Patch):
    """Insert SGLang 0.5.10's capability-12 branch before GPT-OSS's Blackwell MXFP4 branch."""

    id = "sm120-mxfp4-moe-backend"
    description = "GPT-OSS MXFP4 on capability 12 uses the triton_kernels MoE runner (0.5.10)"
    symptom = (
        "GPT-OSS (MXFP4) gets the SM100-only FlashInfer trtllm-gen MoE kernel and fails to start"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = TARGET
    concerns = Concerns(architectures=("GptOssForCausalLM",), quantization=("mxfp4",))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        head = _mxfp4_chain(module)
        chain = cst_tools.if_chain(head)
        if _position(chain, SM120_GATES) is not None:
            raise AlreadyPresent("the MXFP4 MoE choice has a branch for capability 12")
        index = _position(chain, BLACKWELL_GATES)
        if index is None:
            raise AnchorMissing("no `is_blackwell_supported() and is_mxfp4_quant_format` branch")
        if not any(
            "is_sm120_supported" in cst_tools.imported_names(module, source)
            for source in ("sglang.srt.utils", "sglang.srt.utils.common")
        ):
            raise AnchorMissing("the module does not import is_sm120_supported")
        assigned = [
            small
            for small in cst_tools.walk(chain[index].body, cst.Assign)
            if isinstance(small.targets[0].target, cst.Attribute)
            and small.targets[0].target.attr.value == "moe_runner_backend"
        ]
        if len(assigned) != 1:
            raise AnchorMissing("the Blackwell branch does not set moe_runner_backend once")
        target = module.code_for_node(assigned[0].targets[0].target)
        branch = cst_tools.statement(BRANCH.format(target=target), module)
        if not isinstance(branch, cst.If):
            raise AnchorMissing("the capability-12 branch did not parse as an if statement")
        return cst_tools.replace_statement(
            module, head, cst_tools.with_branch_before(head, index, branch)
        )

    def postcondition(self, module: cst.Module, release: Version) -> None:
        chain = cst_tools.if_chain(_mxfp4_chain(module))
        sm120 = _position(chain, SM120_GATES)
        if sm120 is None:
            raise PostconditionFailed("capability 12 has no branch of its own")
        blackwell = _position(chain, BLACKWELL_GATES)
        if blackwell is not None and blackwell < sm120:
            raise PostconditionFailed("the Blackwell branch still comes before capability 12's")
