"""Run a release's own DSA KV-dtype and backend choice on a stand-in.

From 0.5.15 (`arg_groups/overrides.py`): the two passes (`_dsa_kv_cache_dtype_default`, then
`_dsa_split_backend_resolution`, as the release's post-process order runs them) are compiled from
the release's source with the module-level helpers they call. Before (`server_args.py`): the
statements of `ServerArgs._handle_model_specific_adjustments` from its capability read to its
backend call (`major, _ = torch.cuda.get_device_capability()`, `self._set_default_nsa_kv_cache_dtype
(...)`, `self._set_default_nsa_backends(...)`; `_dsa_` from 0.5.13) run as a method of a class
holding the ServerArgs methods they call, with the release's own `arg_groups/hisparse_hook.py`
(0.5.12+). torch, `is_deepseek_dsa` and the server-args view are stand-ins that report the chosen
capability, architecture and flags. Nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
import copy
import functools
import sys
import types
from collections.abc import Callable
from typing import Any, Optional
from unittest import mock

from packaging.version import Version

from tests.support import stand_ins_moe, syntax, wheels

PASSES = ("_dsa_kv_cache_dtype_default", "_dsa_split_backend_resolution")
OVERRIDES = Version("0.5.15")  # the choice moved out of ServerArgs into arg_groups/overrides.py
HISPARSE_HOOK = "sglang/srt/arg_groups/hisparse_hook.py"
HELPERS = ("_check_dsa_backend_constraints", "_check_tilelang_dsa_fp8_kv")


class View:
    """The resolving server-args view the passes read (and update with what they declare)."""

    def __init__(self, architecture: str, kv_cache_dtype: str, **flags: Any) -> None:
        self.hf_config = types.SimpleNamespace(architectures=[architecture], learnable_sink=False)
        self.kv_cache_dtype = kv_cache_dtype
        self.dsa_prefill_backend: str | None = None
        self.dsa_decode_backend: str | None = None
        self.dsa_topk_backend = "sgl-kernel"
        self.enable_hisparse = False
        self.dcp_size = 1
        for name, value in flags.items():
            setattr(self, name, value)

    def get_model_config(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(hf_config=self.hf_config)


def _compiled(source: bytes, names: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    wanted = set(PASSES) | set(HELPERS) | {"_DEEPSEEK_FAMILY_ARCHS"}
    body = [
        _undecorated(node)
        for node in syntax.tree(source).body
        if (isinstance(node, ast.FunctionDef) and node.name in wanted)
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets)
        )
    ]
    namespace = dict(names)
    exec(compile(ast.Module(body=body, type_ignores=[]), "overrides.py", "exec"), namespace)
    return {name: namespace[name] for name in PASSES}


def _undecorated(node: ast.stmt) -> ast.stmt:
    """`@register_post_process` only registers: run the functions bare (a copy: the tree is
    shared)."""
    if not isinstance(node, ast.FunctionDef):
        return node
    bare = copy.copy(node)
    bare.decorator_list = []
    return bare


def resolve(source: bytes, release: str, capability: tuple[int, int], view: View) -> dict[str, Any]:
    """What the release's choice leaves set: KV dtype and DSA prefill/decode backends."""
    if Version(release) < OVERRIDES:
        return _resolve_server_args(source, release, capability, view)
    names = stand_ins_moe.host_names(release, capability)
    platform = stand_ins_moe.StandInPlatform(capability)
    platform.is_npu = False  # type: ignore[attr-defined]  # the DSA passes ask it too
    names.update(
        {
            "Any": Any,
            "Dict": dict,
            "Optional": Optional,
            "model_config_of": lambda v: v.get_model_config(),
            "is_xpu": lambda: False,
            "get_platform": lambda: platform,
        }
    )
    passes = _compiled(source, names)
    configs = types.ModuleType("sglang.srt.configs.model_config")
    configs.is_deepseek_dsa = lambda config: True  # type: ignore[attr-defined]
    modules = {
        "torch": stand_ins_moe.stand_in_torch(capability),
        "sglang.srt.configs.model_config": configs,
    }
    with mock.patch.dict(sys.modules, modules):
        for name in PASSES:
            for key, value in passes[name](view).items():
                setattr(view, key, value)
    return {
        "kv_cache_dtype": view.kv_cache_dtype,
        "prefill": view.dsa_prefill_backend,
        "decode": view.dsa_decode_backend,
    }


def _self_calls(nodes: list[ast.stmt]) -> list[str]:
    """The `self.<method>(...)` calls among `nodes`, in order."""
    return [
        call.func.attr
        for node in nodes
        for call in ast.walk(node)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
    ]


@functools.cache  # a ServerArgs source is some 300 KB: parse it once
def _steps(source: bytes) -> tuple[list[ast.stmt], dict[str, ast.FunctionDef], set[str]]:
    """The DSA statements of `_handle_model_specific_adjustments`, the methods they call and
    the architectures of the `if model_arch in [...]` that reaches them."""
    tree = syntax.tree(source)
    (server_args,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    ]
    methods = {n.name: n for n in server_args.body if isinstance(n, ast.FunctionDef)}
    adjust = methods["_handle_model_specific_adjustments"]
    owners: list[tuple[ast.AST, list[ast.stmt]]] = [
        (node, body)
        for node in ast.walk(adjust)
        for body in (getattr(node, "body", None), getattr(node, "orelse", None))
        if isinstance(body, list)
        and any(
            c.endswith("sa_backends")
            for c in _self_calls([s for s in body if isinstance(s, ast.Expr)])
        )
    ]
    if len(owners) != 1:
        raise LookupError(f"expected one block calling the DSA backend choice, found {len(owners)}")
    ((_, block),) = owners
    start = next(
        i
        for i, node in enumerate(block)
        if isinstance(node, ast.Assign) and "get_device_capability" in ast.unparse(node.value)
    )
    end = next(
        i
        for i, node in enumerate(block)
        if isinstance(node, ast.Expr)
        and any(c.endswith("sa_backends") for c in _self_calls([node]))
    )
    steps = block[start : end + 1]
    gates = [
        node
        for node in ast.walk(adjust)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and ast.unparse(node.test.left) == "model_arch"
        and isinstance(node.test.ops[0], ast.In)
        and any(step is block[start] for child in node.body for step in ast.walk(child))
    ]
    if len(gates) != 1:
        raise LookupError(f"expected one `if model_arch in [...]` around it, found {len(gates)}")
    test = gates[0].test
    assert isinstance(test, ast.Compare)
    architectures = set(ast.literal_eval(test.comparators[0]))
    return steps, {name: methods[name] for name in _self_calls(steps)}, architectures


def _resolve_server_args(
    source: bytes, release: str, capability: tuple[int, int], view: View
) -> dict[str, Any]:
    steps, methods, architectures = _steps(source)
    prefix = "dsa" if any("_dsa_" in name for name in methods) else "nsa"
    if view.hf_config.architectures[0] not in architectures:  # the release never gets there
        return {
            "kv_cache_dtype": view.kv_cache_dtype,
            "prefill": view.dsa_prefill_backend,
            "decode": view.dsa_decode_backend,
        }
    run = ast.FunctionDef(
        name="_run",
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg("self")], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=steps,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    if sys.version_info >= (3, 12):
        run.type_params = []
    body: list[ast.stmt] = [*methods.values(), run]
    stand_in = ast.ClassDef(name="ServerArgs", bases=[], keywords=[], body=body, decorator_list=[])
    if sys.version_info >= (3, 12):
        stand_in.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[stand_in], type_ignores=[]))
    torch = stand_ins_moe.stand_in_torch(capability)
    namespace: dict[str, Any] = {
        **stand_ins_moe.host_names(release, capability),
        "Optional": Optional,
        "torch": torch,
    }
    exec(compile(module, "server_args.py", "exec"), namespace)
    server_args = namespace["ServerArgs"]()
    server_args.__dict__.update(vars(view))
    for side in ("prefill", "decode"):
        setattr(server_args, f"{prefix}_{side}_backend", getattr(view, f"dsa_{side}_backend"))
    server_args.quantization = None
    modules: dict[str, Any] = {"torch": torch}
    if HISPARSE_HOOK in wheels.members(release, HISPARSE_HOOK):
        hook = types.ModuleType("sglang.srt.arg_groups.hisparse_hook")
        exec(compile(wheels.member(release, HISPARSE_HOOK), HISPARSE_HOOK, "exec"), hook.__dict__)
        modules[hook.__name__] = hook
    with mock.patch.dict(sys.modules, modules):
        server_args._run()
    return {
        "kv_cache_dtype": server_args.kv_cache_dtype,
        "prefill": getattr(server_args, f"{prefix}_prefill_backend"),
        "decode": getattr(server_args, f"{prefix}_decode_backend"),
    }
