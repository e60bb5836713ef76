"""A stand-in CUDA box (`Machine`) and the release's own capability probes run on it.

`helpers` lifts `is_sm100_supported`, `is_blackwell_supported`, `get_device_sm`, ... out of the
release's `sglang/srt/utils/common.py` and runs them against a stand-in `torch.cuda`; `Platform`
maps `get_platform()`'s facts (0.5.19+) onto those probes through the release's own
`_PLATFORM_PROBES` table, and `Envs` is its `envs` with the release's own defaults. Nothing here
imports torch or SGLang.
"""

from __future__ import annotations

import ast
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from unittest import mock

from sglpatch.doctor.resolve.stand_ins import STUBBED
from tests.support import syntax, wheels

COMMON = "sglang/srt/utils/common.py"
ENVIRON = "sglang/srt/environ.py"
RUNTIME_CONTEXT = "sglang/srt/runtime_context.py"

# The DeepGEMM installed next to SGLang. "hopper-blackwell": a build with SM90/SM100 kernels only
# (every DeepGEMM the releases before 0.5.20 shipped against); "sm120": a build exposing the SM120
# entry points 0.5.20/0.5.21 probe for (DeepGEMM#324).
DeepGemm = Literal["absent", "hopper-blackwell", "sm120"]

# Probes taken from the release's own common.py, with whatever they call there.
CAPABILITY_PROBES = (
    "get_device_sm",
    "get_device_capability",
    "get_cuda_version",
    "is_cuda",
    "is_hip",
    "is_cuda_alike",
    "is_blackwell",
    "is_blackwell_supported",
    "is_sm90_supported",
    "is_sm100_supported",
    "is_sm100_or_sm110_supported",
    "is_sm110_supported",
    "is_sm120_supported",
    "is_hopper_with_cuda_12_3",
)


@dataclass(frozen=True)
class Machine:
    """One CUDA box: its capability, CUDA version, what is installed and the environment."""

    capability: tuple[int, int]
    deep_gemm: DeepGemm = "hopper-blackwell"
    flashinfer: bool = True
    cuda: str = "12.9"
    env: tuple[tuple[str, Any], ...] = ()  # environment variables set, as (name, value) pairs


class Anything(mock.MagicMock):
    """A stand-in for whatever a module imports and does not decide with.

    Used as a decorator (`@register_custom_op(...)`, `@torch.library.register_fake(...)`) it hands
    the function back, so the module's own functions keep their identity and names.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return args[0]
        return Anything()

    def _get_child_mock(self, **kw: Any) -> mock.MagicMock:
        # Magic methods (`__bool__`, `__iter__`) keep MagicMock's own answers.
        if str(kw.get("_new_name", "")).startswith("__"):
            return mock.MagicMock(**kw)
        return Anything(**kw)


def _torch(machine: Machine) -> Any:
    torch = Anything(name="torch")
    torch.version = types.SimpleNamespace(cuda=machine.cuda, hip=None)
    torch.__version__ = "2.9.1+cu129"
    torch.cuda.is_available = lambda: True
    torch.cuda.is_initialized = lambda: True
    torch.cuda.get_device_capability = lambda device=None: machine.capability
    for absent in ("npu", "xpu", "hpu", "musa"):  # `hasattr(torch, "npu")` must be False
        delattr(torch, absent)
    return torch


def _defined_names(statement: ast.stmt) -> list[str]:
    if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, ast.Assign):
        return [n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


@functools.cache
def env_defaults(release: str) -> dict[str, Any]:
    return _read_env_defaults(release)


@functools.cache
def _probe_code(release: str) -> types.CodeType:
    """The release's capability probes and everything of common.py they call, compiled."""
    tree = syntax.tree(wheels.member(release, COMMON))
    defines: dict[str, ast.stmt] = {}
    for statement in tree.body:
        for name in _defined_names(statement):
            defines.setdefault(name, statement)
    wanted: list[ast.stmt] = []
    pending = [n for n in CAPABILITY_PROBES if n in defines]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name in STUBBED:
            continue
        seen.add(name)
        statement = defines[name]
        if statement not in wanted:
            wanted.append(statement)
        pending += [
            n.id
            for n in ast.walk(statement)
            if isinstance(n, ast.Name) and n.id in defines and n.id not in seen
        ]
    body = sorted(wanted, key=lambda s: s.lineno)  # definitions in their own order
    return compile(ast.Module(body=body, type_ignores=[]), COMMON, "exec")


def _read_env_defaults(release: str) -> dict[str, Any]:
    """`SGLANG_X = EnvBool(True)` rows of the release's environ.py, as {name: default}."""
    try:
        source = wheels.member(release, ENVIRON)
    except KeyError:  # 0.5.3 and 0.5.3.post1 read os.environ through get_bool_env_var only
        return {}
    defaults: dict[str, Any] = {}
    for node in ast.walk(syntax.tree(source)):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defaults[target.id] = node.value.args[0].value
    return defaults


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("true", "1", "yes")


def helpers(release: str, machine: Machine) -> dict[str, Any]:
    """The release's own capability probes, bound to the stand-in machine."""
    env = dict(machine.env)

    def get_bool_env_var(name: str, default: str = "false") -> bool:
        return _truthy(env.get(name, default))

    namespace: dict[str, Any] = {
        **vars(typing),
        "torch": _torch(machine),
        "lru_cache": functools.lru_cache,
        "partial": functools.partial,
        "get_bool_env_var": get_bool_env_var,
        "is_flashinfer_available": lambda: machine.flashinfer,
        **STUBBED,
    }
    exec(_probe_code(release), namespace)
    return namespace


class Envs:
    """SGLang's `envs`: the release's own defaults, overridden by the machine's environment."""

    def __init__(self, defaults: Mapping[str, Any], env: Mapping[str, Any]) -> None:
        self._values = {**defaults, **env}

    def __getattr__(self, name: str) -> Any:
        if name not in self._values:
            raise AttributeError(f"the release's environ.py has no {name}")
        value = self._values[name]
        return types.SimpleNamespace(get=lambda: value, is_set=lambda: False)


@functools.cache
def _platform_table(release: str) -> dict[str, str]:
    """The release's `_PLATFORM_PROBES` and `_PLATFORM_VALUES`: fact -> probe in common.py."""
    table: dict[str, str] = {}
    for node in syntax.tree(wheels.member(release, RUNTIME_CONTEXT)).body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            names = _defined_names(node) if isinstance(node, ast.Assign) else [
                node.target.id if isinstance(node.target, ast.Name) else ""
            ]  # fmt: skip
            if {"_PLATFORM_PROBES", "_PLATFORM_VALUES"} & set(names):
                table.update(ast.literal_eval(node.value))
    return table


class Platform:
    """`get_platform()`: each fact is the probe the release's `_PLATFORM_PROBES` names."""

    def __init__(self, release: str, probes: Mapping[str, Any]) -> None:
        self._table, self._probes = _platform_table(release), probes

    def __getattr__(self, name: str) -> Any:
        return self._probes[self._table[name]]()
