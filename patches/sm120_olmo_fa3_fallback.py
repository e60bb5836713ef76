"""Give Olmo2/Olmo3 on capability 12 the Triton attention backend, not FlashAttention 3.

Why: when `--attention-backend` is not given, SGLang's Olmo2 override (Olmo3 checkpoints load as
`Olmo2ForCausalLM`; added with Olmo 3 support, sgl-project/sglang PR #11396) picks `trtllm_mha`
on SM100, then `fa3` for every other CUDA GPU with `get_device_sm() >= 80`, and Triton only
below. Capability 12 passes `>= 80`, but FlashAttention 3 is built for majors 8 and 9 only: an
RTX PRO 6000, RTX 5090 or GB10 dies at start-up in `create_flashattention_v3_backend` with
"FlashAttention v3 Backend requires SM>=80 and SM<=90". FlashInfer, SGLang's usual default on
12, is refused for this architecture by the override's own assertion ("FlashInfer backend can
significantly degrade the performance of Olmo3 models"), so capability 12 gets the branch's own
fallback, Triton. This patch inserts a capability-12 branch right before the `fa3` one; every
other capability takes the branch it took before. The branch lived in
`ServerArgs._handle_model_specific_adjustments` (0.5.4-0.5.14), `arg_groups/overrides.py`
(0.5.15-0.5.18) and `arg_groups/model_overrides/olmo2.py` (from 0.5.19).

Sources: found in the release trees (issue 19); no upstream issue or PR names it. The
workaround without sglpatch is `--attention-backend triton`.

Delete when: a release fixes it upstream (none has as of 0.5.23). 0.5.3 has no Olmo2 override.
"""

from __future__ import annotations

from typing import ClassVar

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

OVERRIDE = ByRelease(
    {
        ">=0.5.4,<0.5.15": "srt/server_args.py",
        ">=0.5.15,<0.5.19": "srt/arg_groups/overrides.py",
        ">=0.5.19": "srt/arg_groups/model_overrides/olmo2.py",
    }
)
SM120_GATES = {"is_sm120_supported", "is_sm120"}  # the helper, and get_platform().is_sm120
FALLBACK = "triton"
ADJUSTMENTS = "_handle_model_specific_adjustments"

# The branch in the shape of the `fa3` branch it precedes: the helpers (to 0.5.18) or
# get_platform() (from 0.5.19).
HELPER_BRANCH = """\
if is_cuda() and is_sm120_supported():
    # FA3 is built for SM80-SM90 only (sglpatch: capability 12 takes Triton)
    {target} = "{backend}"
"""
PLATFORM_BRANCH = """\
if get_platform().is_cuda and get_platform().is_sm120:
    # FA3 is built for SM80-SM90 only (sglpatch: capability 12 takes Triton)
    {target} = "{backend}"
"""


def _assigned(branch: cst.If, backend: str) -> list[cst.Assign]:
    """Assignments of the string `backend` to `...attention_backend...` in the branch's body."""
    found = []
    for assign in cst_tools.walk(branch.body, cst.Assign):
        value = assign.value
        if not (isinstance(value, cst.SimpleString) and value.evaluated_value == backend):
            continue
        target = assign.targets[0].target
        names = {s.evaluated_value for s in cst_tools.walk(target, cst.SimpleString)}
        if isinstance(target, cst.Attribute):
            names.add(target.attr.value)
        if "attention_backend" in names:
            found.append(assign)
    return found


def _from_ampere(branch: cst.If) -> bool:
    """`... >= 80`: the gate that lets every capability from 8.0 on, 12 included, through."""
    return any(
        isinstance(c.operator, cst.GreaterThanEqual)
        and isinstance(c.comparator, cst.Integer)
        and c.comparator.value == "80"
        for c in cst_tools.walk(branch.test, cst.ComparisonTarget)
    )


def _names_sm120(branch: cst.If) -> bool:
    names = {n.value for n in cst_tools.walk(branch.test, cst.Name)}
    attributes = {a.attr.value for a in cst_tools.walk(branch.test, cst.Attribute)}
    return bool((names | attributes) & SM120_GATES)


def _fa3_position(chain: list[cst.If]) -> int | None:
    return next((i for i, b in enumerate(chain) if _from_ampere(b) and _assigned(b, "fa3")), None)


class Sm120OlmoFa3Fallback(Patch):
    """Insert a capability-12 -> Triton branch before Olmo2's `>= 80 -> fa3` branch."""

    id = "sm120-olmo-fa3-fallback"
    description = "Olmo2/Olmo3 without --attention-backend: capability 12 gets triton, not fa3"
    symptom = "Olmo2/Olmo3 dies at start-up: FlashAttention v3 Backend requires SM>=80 and SM<=90"
    tested = TESTED
    files = OVERRIDE
    # Olmo 3 checkpoints are renamed to Olmo2ForCausalLM by SGLang's configs/olmo3.py.
    concerns = Concerns(architectures=("Olmo2ForCausalLM", "Olmo3ForCausalLM"))
    # Where the choice lives: the override function (0.5.15+), else the ServerArgs branch
    # testing the architecture.
    function: ClassVar[str] = "_olmo2_overrides"
    architecture: ClassVar[str] = "Olmo2ForCausalLM"

    def _scopes(self, module: cst.Module) -> list[cst.CSTNode]:
        functions = [
            s
            for s in module.body
            if isinstance(s, cst.FunctionDef) and s.name.value == self.function
        ]
        if functions:
            return list(functions)
        # To 0.5.14: the branch of ServerArgs' model adjustments that tests the architecture
        # (searched in that method alone: the module is large, and proved three times).
        server_args = [s for s in module.body if isinstance(s, cst.ClassDef)]
        methods = [
            m
            for c in server_args
            if c.name.value == "ServerArgs"
            for name, m in cst_tools.methods(c).items()
            if name == ADJUSTMENTS
        ]
        return [
            b.body
            for m in methods
            for b in cst_tools.find_compound(m, cst.If)
            if any(
                s.evaluated_value == self.architecture
                for s in cst_tools.walk(b.test, cst.SimpleString)
            )
        ]

    def _choice(self, module: cst.Module) -> tuple[cst.If, list[cst.If], int]:
        """The one if/elif chain of the architecture's choice with the `fa3` branch: its head,
        its branches and the index of the `fa3` one."""
        found: list[tuple[cst.If, list[cst.If], int]] = []
        for scope in self._scopes(module):
            for chain in cst_tools.if_chains(scope):
                index = _fa3_position(chain)
                if index is not None:
                    found.append((chain[0], chain, index))
        if len(found) != 1:
            raise AnchorMissing(
                f"expected one `>= 80 -> fa3` choice for {self.architecture}, found {len(found)}"
            )
        return found[0]

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        head, chain, index = self._choice(module)
        if any(_names_sm120(b) for b in chain[:index]):
            raise AlreadyPresent(f"{self.architecture}'s choice has a branch for capability 12")
        fa3 = chain[index]
        uses_platform = any(
            isinstance(c.func, cst.Name) and c.func.value == "get_platform"
            for c in cst_tools.walk(fa3.test, cst.Call)
        )
        if not uses_platform and "is_sm120_supported" not in cst_tools.imported_names(module):
            raise AnchorMissing("the module does not import is_sm120_supported")
        assigns = _assigned(fa3, "fa3")
        if len(assigns) != 1:
            raise AnchorMissing("the `fa3` branch does not set the attention backend once")
        target = module.code_for_node(assigns[0].targets[0].target)
        code = PLATFORM_BRANCH if uses_platform else HELPER_BRANCH
        branch = cst_tools.statement(code.format(target=target, backend=FALLBACK), module)
        if not isinstance(branch, cst.If):
            raise AnchorMissing("the capability-12 branch did not parse as an if statement")
        return cst_tools.replace_statement(
            module, head, cst_tools.with_branch_before(head, index, branch)
        )

    def postcondition(self, module: cst.Module, release: Version) -> None:
        _, chain, index = self._choice(module)
        if not any(_names_sm120(b) and _assigned(b, FALLBACK) for b in chain[:index]):
            raise PostconditionFailed(
                f"no branch before {self.architecture}'s `fa3` sends capability 12 to {FALLBACK}"
            )
