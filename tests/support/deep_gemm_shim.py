"""Where each DeepGEMM call of a release's DSA indexer or backend lands, on a stand-in device.

The call sites are read from the file (every `deep_gemm.<name>` of the four MQA-logits names).
The name each goes through is bound as the file binds it: the `import deep_gemm` of its scope
(the module's, or the enclosing method's up to 0.5.12's backend) and the statement after it,
run against a stand-in `deep_gemm` module, with the file's own `_SglpatchSm120DeepGemm` (patched)
compiled against a stand-in torch, the release's own `is_cuda` and a chosen environment. Each
site's attribute is then looked up on that binding: DeepGEMM's stand-in function, or the shim's
torch code. Nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
import os
import sys
import types
from collections.abc import Mapping
from typing import Any, NamedTuple
from unittest import mock

from packaging.version import Version

from sglpatch.patch import Patch
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels

SHIM = "_SglpatchSm120DeepGemm"
ROUTED = ("fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata", "get_num_sms")
VARIABLE = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
FIRST, LAST = Version("0.5.9"), Version("0.5.21")  # the releases both patches are for
RELEASES = stand_ins.releases(str(FIRST), str(LAST))


class Site(NamedTuple):
    line: int
    name: str  # the DeepGEMM function read there
    # the function whose own `import deep_gemm` it reads; None: the module's
    scope: ast.FunctionDef | None


def _is_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.Import) and [a.name for a in node.names] == ["deep_gemm"]


def _own_import(function: ast.FunctionDef) -> bool:
    """Whether `function` imports deep_gemm itself (not in a nested function)."""
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if _is_import(node):  # type: ignore[arg-type]
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def call_sites(source: bytes) -> list[Site]:
    """The file's reads of DeepGEMM's four functions, outside the shim, in line order."""
    found: list[Site] = []

    def visit(node: ast.AST, scope: ast.FunctionDef | None) -> None:
        if isinstance(node, ast.ClassDef) and node.name == SHIM:
            return
        if isinstance(node, ast.FunctionDef) and _own_import(node):
            scope = node
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "deep_gemm"
            and node.attr in ROUTED
        ):
            found.append(Site(node.lineno, node.attr, scope))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(syntax.tree(source), None)
    return sorted(found, key=lambda s: s.line)


def _rebinds(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["deep_gemm"]


def _binding(scope: ast.AST) -> list[ast.stmt]:
    """The `import deep_gemm` of `scope`, with the statement after it if that rebinds the name
    (the shim's rebinding, in a patched file)."""
    for node in ast.walk(scope):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, statement in enumerate(block):
                if _is_import(statement):
                    after = block[i + 1 : i + 2]
                    return [statement, *(a for a in after if _rebinds(a))]
    raise LookupError("no `import deep_gemm` in scope")


def _torch(capability: tuple[int, int], hip: bool, asked: list[str]) -> types.SimpleNamespace:
    torch = stand_ins.stand_in_torch(capability)
    if hip:  # ROCm: gfx1250 reports major 12 too
        torch.version = types.SimpleNamespace(cuda=None, hip="7.0")
    capability_of = torch.cuda.get_device_capability

    def asked_capability(device: Any = None) -> tuple[int, int]:
        asked.append("capability")
        return capability_of(device)

    torch.cuda.get_device_capability = asked_capability
    return torch


class Landing(NamedTuple):
    sites: dict[int, str]  # line -> "torch" or "deep_gemm"
    asked_at_import: bool  # whether binding the name read the device


def land(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    variable: str | None = None,
    hip: bool = False,
) -> Landing:
    """Where each call site of `source` lands on this device with this environment."""
    tree = syntax.tree(source)
    asked: list[str] = []
    torch = _torch(capability, hip, asked)
    with mock.patch.object(stand_ins, "stand_in_torch", lambda c, cuda="12.8": torch):
        is_cuda = stand_ins.device_predicates(release, capability)["is_cuda"]
    names: dict[str, Any] = {"torch": torch, "is_cuda": is_cuda}
    shims = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == SHIM]
    exec(compile(ast.Module(body=shims, type_ignores=[]), "shim", "exec"), names)
    deep_gemm = types.ModuleType("deep_gemm")
    for name in ROUTED:
        setattr(deep_gemm, name, lambda *a, _n=name, **k: f"deep_gemm.{_n}")
    environment = {} if variable is None else {VARIABLE: variable}
    landed: dict[int, str] = {}
    bound: dict[int, Any] = {}
    with (
        mock.patch.dict(sys.modules, {"deep_gemm": deep_gemm}),
        mock.patch.dict(os.environ, environment, clear=False),
    ):
        if variable is None:
            os.environ.pop(VARIABLE, None)
        sites = call_sites(source)
        for scope in {id(s.scope): s.scope for s in sites}.values():
            namespace = dict(names)
            body = _binding(tree if scope is None else scope)
            exec(compile(ast.Module(body=body, type_ignores=[]), "binding", "exec"), namespace)
            bound[id(scope)] = namespace["deep_gemm"]
        at_import = bool(asked)
        for site in sites:
            value = getattr(bound[id(site.scope)], site.name)
            if value is getattr(deep_gemm, site.name):
                landed[site.line] = "deep_gemm"
            elif getattr(value, "__qualname__", "") == f"{SHIM}.torch_{site.name}":
                landed[site.line] = "torch"
            else:
                raise AssertionError(f"line {site.line}: {site.name} is {value!r}")
    return Landing(landed, at_import)


def everywhere(landing: Landing) -> set[str]:
    """Where the sites land, as a set: {"torch"} when every one takes the torch code."""
    return set(landing.sites.values())


def path(patch: Patch, release: str) -> str:
    target = patch.files.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


def pristine(patch: Patch, release: str) -> bytes:
    return wheels.member(release, path(patch, release))


def expected(release: Version) -> str:
    return "applied" if FIRST <= release <= LAST else "not for this release"


def effect(patch: Patch, release: Version, members: Mapping[str, bytes]) -> None:
    """On 12 every call site takes the torch code, elsewhere DeepGEMM, and nothing reads the
    device when the module binds the name."""
    source = members[path(patch, str(release))]
    for capability in stand_ins.SM120:
        landing = land(source, str(release), capability)
        assert everywhere(landing) == {"torch"} and not landing.asked_at_import
    for capability in stand_ins.OTHERS:
        assert everywhere(land(source, str(release), capability)) == {"deep_gemm"}


def symptom(patch: Patch, release: Version, members: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 reaches DeepGEMM at every call site."""
    source = members[path(patch, str(release))]
    for capability in stand_ins.SM120:
        assert everywhere(land(source, str(release), capability)) == {"deep_gemm"}
