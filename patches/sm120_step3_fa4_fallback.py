"""Keep Step3p5/Step3p7 on capability 12 off FlashAttention 4 where it has no SM120 paged-KV path.

Why: when no attention backend is given, SGLang's Step3p5/Step3p7 override (added in 0.5.13 in
`ServerArgs._handle_model_specific_adjustments`, moved to `arg_groups/overrides.py` in 0.5.15)
picks `fa4` whenever `is_blackwell_supported()` holds, and that predicate counts capability 12
as Blackwell. Up to 0.5.17 FlashAttention 4 cannot serve SGLang on 12: flash-attn-4 4.0.0b9 (the
floor of 0.5.13), 4.0.0b15 (pinned by 0.5.14-0.5.15), 4.0.0b18 (0.5.16-0.5.17) and 0.5.17's
vendored copy take capability 12 to their SM120 forward, which asserts "Paged KV not supported
on SM 12.0 in this PR", and SGLang's FA4 calls always pass the KV cache's page table. An
RTX PRO 6000, RTX 5090 or GB10 serving Step-3.5 stops at its first forward (CUDA-graph capture)
on that assertion. This patch inserts a capability-12 branch before the Blackwell one that
selects nothing: `attention_backend` stays unset and the release's generic default chooses, as
it does for every other MHA model on 12 (FlashInfer, Triton without it; the release places no
constraint on Step3p5's backend). 8.9, 9.0 and 10.0 take the branch they took before.

From 0.5.18 SGLang's FlashAttention-4 backend imports its own SM120 port
(`kernels/ops/attention/flash_attention_v4_sm120.py`) when the capability major is 12, so `fa4`
runs there and the file is left alone ("already upstream", fixed in 0.5.18).

Sources: triage hunks `70b7fd7263` (0.5.13, server_args.py) and `099280ff78` (0.5.19,
arg_groups/overrides.py); flash_attn/cute/interface.py of the flash-attn-4 wheels named above;
the kernel-support table's `fa4` readings. No upstream issue or PR names it. The workaround
without sglpatch is `--attention-backend flashinfer` (or triton).

Delete when: the oldest release in use is 0.5.18 or newer.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AlreadyUpstream,
    AnchorMissing,
    ByRelease,
    Concerns,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

OVERRIDE = ByRelease(
    {
        ">=0.5.13,<0.5.15": "srt/server_args.py",
        ">=0.5.15": "srt/arg_groups/overrides.py",
    }
)
# The first release whose fa4 runs on capability 12 (SGLang's own SM120 FA4 port).
FA4_ON_SM120 = Version("0.5.18")
ARCHITECTURE = "Step3p5ForCausalLM"
FUNCTION = "_step3p_overrides"  # 0.5.15+
ADJUSTMENTS = "_handle_model_specific_adjustments"  # to 0.5.14
BACKEND = "fa4"
SM120_GATES = {"is_sm120_supported", "is_sm120"}  # the helper, and get_platform().is_sm120
BLACKWELL_GATES = {"is_blackwell_supported", "is_blackwell"}

BRANCH = """\
if is_sm120_supported():
    # no paged-KV SM120 kernel in this fa4 (sglpatch): the default backend applies
    logger.info(
        "Not auto-selecting fa4 for Step3p7 on SM120 (no paged-KV SM120 kernel); "
        "the default attention backend applies."
    )
"""


def _gates(branch: cst.If) -> set[str]:
    names = {n.value for n in cst_tools.walk(branch.test, cst.Name)}
    attributes = {a.attr.value for a in cst_tools.walk(branch.test, cst.Attribute)}
    return names | attributes


def _sets_backend(branch: cst.If, backend: str | None = None) -> bool:
    """Whether the branch's body assigns `...attention_backend...` (to `backend`, if given)."""
    for assign in cst_tools.walk(branch.body, cst.Assign):
        value = assign.value
        if backend is not None and not (
            isinstance(value, cst.SimpleString) and value.evaluated_value == backend
        ):
            continue
        for target in assign.targets:
            node = target.target
            names = {s.evaluated_value for s in cst_tools.walk(node, cst.SimpleString)}
            if isinstance(node, cst.Attribute):
                names.add(node.attr.value)
            if "attention_backend" in names:
                return True
    return False


def _fa4_position(chain: list[cst.If]) -> int | None:
    return next(
        (
            i
            for i, b in enumerate(chain)
            if _gates(b) & BLACKWELL_GATES and _sets_backend(b, BACKEND)
        ),
        None,
    )


def _scopes(module: cst.Module) -> list[cst.CSTNode]:
    """The Step3p override function (0.5.15+), else ServerArgs' branch testing the architecture."""
    functions = [
        s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == FUNCTION
    ]
    if functions:
        return list(functions)
    methods = [
        m
        for c in module.body
        if isinstance(c, cst.ClassDef) and c.name.value == "ServerArgs"
        for name, m in cst_tools.methods(c).items()
        if name == ADJUSTMENTS
    ]
    return [
        b.body
        for m in methods
        for b in cst_tools.find_compound(m, cst.If)
        if any(s.evaluated_value == ARCHITECTURE for s in cst_tools.walk(b.test, cst.SimpleString))
    ]


def _choice(module: cst.Module) -> tuple[cst.If, list[cst.If], int]:
    """The one if/elif chain of Step3p's attention choice: its head, branches, the fa4 index."""
    found: list[tuple[cst.If, list[cst.If], int]] = []
    for scope in _scopes(module):
        for chain in cst_tools.if_chains(scope):
            index = _fa4_position(chain)
            if index is not None:
                found.append((chain[0], chain, index))
    if len(found) != 1:
        raise AnchorMissing(
            f"expected one Blackwell -> fa4 choice for {ARCHITECTURE}, found {len(found)}"
        )
    return found[0]


class Sm120Step3Fa4Fallback(Patch):
    """Insert a capability-12 branch that selects nothing before Step3p's Blackwell -> fa4."""

    id = "sm120-step3-fa4-fallback"
    description = (
        "Step3p5/Step3p7 without --attention-backend: 12 gets the default backend, not fa4"
    )
    symptom = (
        "Step-3.5 stops at its first forward: flash-attn-4 asserts "
        "'Paged KV not supported on SM 12.0'"
    )
    tested = TESTED
    fixed_upstream_in = FA4_ON_SM120
    files = OVERRIDE
    concerns = Concerns(architectures=("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        head, chain, index = _choice(module)
        if any(_gates(b) & SM120_GATES for b in chain[:index]):
            raise AlreadyPresent("Step3p's attention choice has a branch for capability 12")
        if release >= FA4_ON_SM120:
            raise AlreadyUpstream(
                f"from {FA4_ON_SM120} fa4 runs on capability 12 (SGLang's own SM120 FA4 port)"
            )
        if not any(
            "is_sm120_supported" in cst_tools.imported_names(module, source)
            for source in ("sglang.srt.utils", "sglang.srt.utils.common")
        ):
            raise AnchorMissing("the module does not import is_sm120_supported")
        branch = cst_tools.statement(BRANCH, module)
        if not isinstance(branch, cst.If):
            raise AnchorMissing("the capability-12 branch did not parse as an if statement")
        return cst_tools.replace_statement(
            module, head, cst_tools.with_branch_before(head, index, branch)
        )

    def postcondition(self, module: cst.Module, release: Version) -> None:
        _, chain, index = _choice(module)
        # Ours selects nothing (the release's default applies); an upstream one may choose.
        if not any(
            _gates(b) & SM120_GATES and not _sets_backend(b, BACKEND) for b in chain[:index]
        ):
            raise PostconditionFailed(
                "no branch before Step3p's fa4 one keeps capability 12 off it"
            )
