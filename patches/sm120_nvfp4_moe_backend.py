"""Send NVFP4 MoE layers on capability 12 to FlashInfer CUTLASS, not trtllm-gen.

Why: from 0.5.11 the ModelOpt NVFP4 MoE method resolves `--moe-runner-backend auto` to
FLASHINFER_TRTLLM on every GPU, and FlashInfer's trtllm-gen MoE kernels exist for SM100 only:
an NVFP4 MoE checkpoint on an RTX PRO 6000 / RTX 5090 / GB10 fails on its first MoE layer.
0.5.13 added a branch to `ServerArgs._handle_moe_kernel_config` that picks `flashinfer_cutlass`
for `auto` + `modelopt_fp4` on SM120; this patch inserts the same branch, right after the
mxfp8 branch it follows upstream, with the test `sm120-nvfp4-moe-checkpoint-quant` gives
upstream's from 0.5.13: without `--quantization`, the checkpoint's (`get_model_config()`) counts,
and is read on SM120 only; and `modelopt_mixed` (0.5.11 - 0.5.12: a NemotronH MIXED_PRECISION
checkpoint, whose NVFP4 MoE layers the same `ModelOptNvFp4FusedMoEMethod` serves) counts as
`modelopt_fp4` does, as `sm120-nvfp4-moe-checkpoint-quant` tests it.

Delete when: the oldest release in use is 0.5.13 or newer (there the branch is upstream's own;
0.5.15 moved it to `arg_groups/overrides.py`, where this patch only recognises it). Releases
before 0.5.11 never default NVFP4 MoE to trtllm-gen: not for them.
"""

from __future__ import annotations

from typing import TypeVar

from packaging.version import Version

from sglpatch.patch import (
    MOE_LAYERS,
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

N = TypeVar("N", bound="cst.CSTNode")
# The quantizations whose MoE layers are ModelOpt NVFP4: the method of both resolves `auto` to
# trtllm-gen, and flashinfer_cutlass's own check of the flag admits both (0.5.10 - 0.5.23).
NVFP4_MOE = ("modelopt_fp4", "modelopt_mixed")
BACKEND = "moe_runner_backend"
METHOD = "_handle_moe_kernel_config"

# Where `auto` is resolved: a ServerArgs method until 0.5.14, a resolution pass from 0.5.15.
RESOLVER = ByRelease(
    {
        ">=0.5.11,<0.5.15": "srt/server_args.py",
        ">=0.5.15": "srt/arg_groups/overrides.py",
    }
)

# Upstream's branch (0.5.13), in the method's own indentation once parsed into it, tested as
# sm120-nvfp4-moe-checkpoint-quant tests it from 0.5.13 (an NVFP4 checkpoint without the flag).
BRANCH = """\
if (
    self.moe_runner_backend == "auto"
    and is_sm120_supported()
    and (self.quantization or self.get_model_config().quantization)
    in {quantizations}
):
    self.moe_runner_backend = "flashinfer_cutlass"
    logger.info(
        "Use flashinfer_cutlass as MoE runner backend on SM120 for NVFP4 MoE "
        "(trtllm-gen MoE kernels are SM100-only)"
    )
""".replace("{quantizations}", "({})".format(", ".join(f'"{q}"' for q in NVFP4_MOE)))


def _names_sm120(node: cst.CSTNode) -> bool:
    """`is_sm120_supported()` (to 0.5.18) or `get_platform().is_sm120` (from 0.5.19)."""
    names = any(n.value == "is_sm120_supported" for n in _descendants(node, cst.Name))
    return names or any(a.attr.value == "is_sm120" for a in _descendants(node, cst.Attribute))


def _descendants(node: cst.CSTNode, kind: type[N]) -> list[N]:
    # cst_tools' field walk: a CSTVisitor over the overrides module costs a second.
    return list(cst_tools.walk(node, kind))


def _routes_to_cutlass(branch: cst.If) -> bool:
    """An `if` testing `"modelopt_fp4"` and SM120 whose body sets the backend to CUTLASS."""
    tests_fp4 = any(s.value.strip("\"'") == "modelopt_fp4" for s in _strings(branch.test))
    if not (tests_fp4 and _names_sm120(branch.test)):
        return False
    for assign in _descendants(branch.body, cst.Assign):
        target = assign.targets[0].target
        name = target.attr.value if isinstance(target, cst.Attribute) else None
        name = target.value if isinstance(target, cst.Name) else name
        value = assign.value
        if (
            name == BACKEND
            and isinstance(value, cst.SimpleString)
            and value.value.strip("\"'") == "flashinfer_cutlass"
        ):
            return True
    return False


def _strings(node: cst.CSTNode) -> list[cst.SimpleString]:
    return _descendants(node, cst.SimpleString)


def _cutlass_branches(node: cst.CSTNode) -> list[cst.If]:
    return [b for b in _descendants(node, cst.If) if _routes_to_cutlass(b)]


class Sm120Nvfp4MoeBackend(Patch):
    """Insert upstream's `auto` + modelopt_fp4 + SM120 -> flashinfer_cutlass branch."""

    id = "sm120-nvfp4-moe-backend"
    description = "NVFP4 MoE `auto` backend resolves to flashinfer_cutlass on capability 12"
    symptom = "NVFP4 MoE models fail in FlashInfer trtllm-gen MoE (SM100-only kernels) on SM120"
    tested = TESTED
    fixed_upstream_in = Version("0.5.13")
    files = RESOLVER
    concerns = Concerns(quantization=NVFP4_MOE, uses=MOE_LAYERS)

    def _method(self, module: cst.Module) -> cst.FunctionDef:
        method = cst_tools.methods(cst_tools.find_class(module, "ServerArgs")).get(METHOD)
        if method is None:
            raise AnchorMissing(f"ServerArgs has no {METHOD}()")
        return method

    def _scope(self, module: cst.Module, release: Version) -> cst.CSTNode:
        """Where upstream's branch lives: the ServerArgs method, or the overrides module."""
        if release >= Version("0.5.15"):
            return module
        return self._method(module)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        scope = self._scope(module, release)
        if _cutlass_branches(scope):
            raise AlreadyPresent("NVFP4 MoE `auto` already resolves to flashinfer_cutlass on SM120")
        if release >= Version("0.5.15"):
            raise AnchorMissing("the overrides module lost upstream's NVFP4 MoE SM120 branch")
        if "is_sm120_supported" not in cst_tools.imported_names(module):
            raise AnchorMissing("server_args.py does not import is_sm120_supported")
        method = self._method(module)
        body = method.body
        if not isinstance(body, cst.IndentedBlock):
            raise AnchorMissing(f"{METHOD}() is a one-line method")
        # Upstream puts the branch right after the mxfp8 branch, which opens the method.
        anchor = next(
            (
                i
                for i, s in enumerate(body.body)
                if isinstance(s, cst.If)
                and any(x.value.strip("\"'") == "mxfp8" for x in _strings(s.test))
            ),
            None,
        )
        if anchor is None:
            raise AnchorMissing(f'{METHOD}() has no `if self.quantization == "mxfp8"` branch')
        parsed = cst.parse_module(BRANCH, config=module.config_for_parsing).body[0]
        # A blank line before it, as upstream spaces it.
        branch = parsed.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        statements = (*body.body[: anchor + 1], branch, *body.body[anchor + 1 :])
        new_method = method.with_changes(body=body.with_changes(body=statements))
        return cst_tools.replace(module, method, new_method)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if not _cutlass_branches(self._scope(module, release)):
            raise PostconditionFailed(
                "no branch sends modelopt_fp4 MoE `auto` to flashinfer_cutlass on SM120"
            )
