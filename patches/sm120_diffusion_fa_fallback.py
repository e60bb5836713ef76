"""Send diffusion (multimodal_gen) attention on capability 12 to Torch SDPA, not FlashAttention.

Why: SGLang's diffusion runtime picks its attention backend in
`CudaPlatformBase.get_attn_backend_cls_str`. From 0.5.5 to 0.5.7 the FlashAttention choice
(the default, and `--attention-backend fa` / `fa3`) goes to sgl-kernel's FA3 on every GPU that
is not capability 10 (those releases' `is_blackwell()` means capability 10 only), and
sgl-kernel's `flash_attn_varlen_func` refuses anything but capability 8 or 9
(`NotImplementedError: flash_attn at sgl-kernel is only supported on sm90 and above`): a diffusion
model on an RTX PRO 6000 / RTX 5090 / GB10 dies at its first attention call. (0.5.7's default
already tries Sage Attention 3 and then Torch SDPA on SM120; its explicit FA branch does not.)
0.5.8 put an SM12.x branch first in both places, falling back to Torch SDPA; this patch inserts
the same branch, with the release's own code as the `else:` of every other capability. Where
0.5.7's default has its own SM120 branch (Sage Attention 3, else SDPA) it is left as it is.

Delete when: the oldest release in use is 0.5.8 or newer (every later release keeps an SM12.x ->
Torch SDPA branch for FlashAttention). Releases before 0.5.5 have no multimodal_gen.
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

TARGET = ByRelease({"<0.5.5": None, ">=0.5.5": "multimodal_gen/runtime/platforms/cuda.py"})
FIXED = Version("0.5.8")
FUNCTION = "get_attn_backend_cls_str"
ENUM = "AttentionBackendEnum"
# 0.5.7 added `Platform.is_sm120()`; before it, ask torch as that method does.
GATE = ByRelease(
    {"<0.5.7": "torch.cuda.get_device_capability()[0] == 12", ">=0.5.7": "cls.is_sm120()"}
)
GATES = {"torch.cuda.get_device_capability()[0] == 12", "cls.is_sm120()", "platform.is_sm120()"}

# 0.5.8's two branches (explicit FlashAttention, then the default), same messages.
EXPLICIT = """\
if {gate}:
    logger.info(
        "FlashAttention is not supported on SM12.x in this build; falling back to Torch SDPA."
    )
    target_backend = AttentionBackendEnum.TORCH_SDPA
else:
    pass
"""
DEFAULT = """\
if {gate}:
    # On SM12.x, the sgl-kernel FlashAttention wheels may not include
    # support yet. Default to Torch SDPA for correctness (sglpatch: from SGLang 0.5.8).
    logger.info("Defaulting to Torch SDPA backend on SM12.x")
    target_backend = AttentionBackendEnum.TORCH_SDPA
else:
    pass
"""


def _names_enum(node: cst.CSTNode, members: set[str]) -> bool:
    return any(
        isinstance(a.value, cst.Name) and a.value.value == ENUM and a.attr.value in members
        for a in cst_tools.walk(node, cst.Attribute)
    )


def _sm120_fallbacks(node: cst.CSTNode, module: cst.Module) -> list[cst.If]:
    """`if <capability 12>:` statements under `node` that lead to Torch SDPA."""
    return [
        branch
        for branch in cst_tools.find_compound(node, cst.If)
        if module.code_for_node(branch.test) in GATES and _names_enum(branch.body, {"TORCH_SDPA"})
    ]


def _function(module: cst.Module) -> cst.FunctionDef:
    found = [
        f for f in cst_tools.find_compound(module, cst.FunctionDef) if f.name.value == FUNCTION
    ]
    if len(found) != 1:
        raise AnchorMissing(f"expected one {FUNCTION}(), found {len(found)}")
    return found[0]


def _chain(function: cst.FunctionDef) -> tuple[cst.If, list[cst.If], cst.Else]:
    """The `if selected_backend == ...: ... else:` chain: its head, branches and default."""
    heads = [
        s
        for s in cst_tools.function_body(function)
        if isinstance(s, cst.If) and "selected_backend" in _code(s.test)
    ]
    if len(heads) != 1:
        raise AnchorMissing(f"expected one `if selected_backend ...` chain, found {len(heads)}")
    branches = cst_tools.if_chain(heads[0])
    default = branches[-1].orelse
    if not isinstance(default, cst.Else):
        raise AnchorMissing("the backend chain has no default `else:`")
    return heads[0], branches, default


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _explicit_fa(branches: list[cst.If]) -> cst.If:
    """The branch for `--attention-backend fa` (`== AttentionBackendEnum.FA3` in 0.5.5)."""
    found = [b for b in branches if _names_enum(b.test, {"FA", "FA3"})]
    if len(found) != 1:
        raise AnchorMissing(f"expected one FlashAttention branch, found {len(found)}")
    return found[0]


def _wrapped(body: cst.BaseSuite, template: str, gate: str, module: cst.Module) -> cst.BaseSuite:
    """`body` behind `if <gate>: <SDPA> else: <body>`."""
    if not isinstance(body, cst.IndentedBlock):
        raise AnchorMissing("a one-line backend branch")
    branch = cst_tools.statement(template.format(gate=gate), module)
    if not (isinstance(branch, cst.If) and isinstance(branch.orelse, cst.Else)):
        raise AnchorMissing("the template is not an if/else")  # our own text: never happens
    else_block = branch.orelse.with_changes(body=branch.orelse.body.with_changes(body=body.body))
    return body.with_changes(body=[branch.with_changes(orelse=else_block)])


class Sm120DiffusionFaFallback(Patch):
    """Insert 0.5.8's SM12.x -> Torch SDPA branches into the diffusion attention choice."""

    id = "sm120-diffusion-fa-fallback"
    description = (
        "diffusion attention on capability 12: Torch SDPA instead of sgl-kernel FA3 (0.5.8)"
    )
    symptom = (
        "diffusion models on SM120 die at the first attention call: flash_attn at sgl-kernel "
        "is only supported on sm90 and above"
    )
    tested = TESTED
    fixed_upstream_in = FIXED
    files = TARGET
    concerns = Concerns(runtime="multimodal_gen")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        if release >= FIXED:
            # Later releases move the choice around (resolver classes by 0.5.23); what stays is
            # an SM12.x branch that leads FlashAttention to Torch SDPA.
            if _sm120_fallbacks(module, module):
                raise AlreadyPresent("FlashAttention falls back to Torch SDPA on SM12.x")
            raise AnchorMissing("no SM12.x -> Torch SDPA branch in the attention choice")
        function = _function(module)
        head, branches, default = _chain(function)
        explicit = _explicit_fa(branches)
        todo_explicit = not _sm120_fallbacks(explicit.body, module)
        todo_default = not _sm120_fallbacks(default.body, module)
        if not (todo_explicit or todo_default):
            raise AlreadyPresent("both FlashAttention choices fall back to Torch SDPA on SM12.x")
        gate = GATE.get(release) or "cls.is_sm120()"
        if gate.startswith("torch.") and not any(
            isinstance(s, cst.SimpleStatementLine)
            and module.code_for_node(s).strip() == "import torch"
            for s in module.body
        ):
            raise AnchorMissing("the module does not import torch")
        rebuilt: cst.If | cst.Else = default
        if todo_default:
            rebuilt = default.with_changes(body=_wrapped(default.body, DEFAULT, gate, module))
        for branch in reversed(branches):
            if branch is explicit and todo_explicit:
                branch = branch.with_changes(body=_wrapped(branch.body, EXPLICIT, gate, module))
            rebuilt = branch.with_changes(orelse=rebuilt)
        if not isinstance(rebuilt, cst.If):
            raise AnchorMissing("the backend chain has no `if`")  # it has: `head` is one
        return cst_tools.replace_statement(module, head, rebuilt)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if release >= FIXED:
            if not _sm120_fallbacks(module, module):
                raise PostconditionFailed("no SM12.x -> Torch SDPA branch")
            return
        _, branches, default = _chain(_function(module))
        for name, node in (
            ("explicit FlashAttention", _explicit_fa(branches)),
            ("default", default),
        ):
            if not _sm120_fallbacks(node.body, module):
                raise PostconditionFailed(f"the {name} choice has no SM12.x -> Torch SDPA branch")
