"""Run SGLang's capability-dependent selection code from a wheel on a stand-in device.

Nothing here imports torch, triton_kernels or SGLang. The capability predicates
(`is_sm100_supported`, `is_blackwell`, `is_sm120_supported`, ...) are the release's OWN definitions,
compiled from its `sglang/srt/utils/common.py` against a stand-in `torch.cuda` that reports the
chosen capability: the predicates moved between releases (`is_blackwell()` meant capability 10
before 0.5.4.post2, 10 or 12 until 0.5.8.post1, 10, 11 or 12 since 0.5.9), so a hand-written stub
would test the wrong thing. Releases from 0.5.19 ask `get_platform()` instead; they get
`StandInPlatform`, derived from the same capability.

The selection code itself is cut out of the release's source with `ast` (one statement or one
function) and run with every free name it reads bound explicitly; a name nobody bound is an
error, never a silently truthy mock.
"""

from __future__ import annotations

import ast
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any
from unittest import mock

from tests.support import syntax, wheels

COMMON = "sglang/srt/utils/common.py"
CAPABILITIES = [(8, 9), (9, 0), (10, 0), (12, 0), (12, 1)]
SM120 = [(12, 0), (12, 1)]
OTHERS = [(8, 9), (9, 0), (10, 0)]
PREDICATES = (
    "is_cuda",
    "is_cuda_alike",
    "is_hip",
    "is_blackwell",
    "is_blackwell_supported",
    "is_sm100_supported",
    "is_sm120_supported",
    "is_sm121",
    "is_sm90_supported",
    "is_hopper_with_cuda_12_3",
)


def stand_in_torch(capability: tuple[int, int], cuda: str = "12.8") -> types.SimpleNamespace:
    """Just what the predicates read: a CUDA build with one device of `capability`."""
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            is_available=lambda: True,
            is_initialized=lambda: True,  # 0.5.23's get_device_sm() asks NVML otherwise
            get_device_capability=lambda device=None: capability,
        ),
        version=types.SimpleNamespace(cuda=cuda, hip=None),
    )


def _top_level_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    found: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
    return found


def _free_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _common_tree(release: str) -> ast.Module:
    return syntax.tree(wheels.member(release, COMMON))


def device_predicates(release: str, capability: tuple[int, int]) -> dict[str, Callable[..., Any]]:
    """The release's own capability predicates, evaluated on a stand-in device.

    Each wanted name is compiled from common.py together with the module-level helpers it uses
    (e.g. `_check_cuda_device_version`); a predicate the release lacks is simply absent.
    """
    definitions = _top_level_definitions(_common_tree(release))
    wanted = [name for name in PREDICATES if name in definitions]
    statements: list[ast.stmt] = []
    todo = list(wanted)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        node = definitions[name]
        if node not in statements:
            statements.append(node)
        todo.extend(_free_names(node) - seen)
    statements.sort(key=lambda s: s.lineno)
    namespace: dict[str, Any] = {
        "torch": stand_in_torch(capability),
        "lru_cache": lru_cache,
        "partial": partial,
        "logging": logging,
        **{k: getattr(typing, k) for k in ("List", "Tuple", "Optional")},
    }
    module = ast.Module(body=statements, type_ignores=[])
    exec(compile(module, COMMON, "exec"), namespace)
    return {name: namespace[name] for name in wanted}


class StandInPlatform:
    """`get_platform()` of releases from 0.5.19, answered from the capability."""

    def __init__(self, capability: tuple[int, int]) -> None:
        major = capability[0]
        self.is_sm90 = major == 9
        self.is_sm100 = major == 10
        self.is_sm120 = major == 12
        self.is_blackwell = major in (10, 11, 12)
        self.is_hip = self.is_xpu = self.is_musa = self.has_amx = False


class _Switch:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value

    def is_set(self) -> bool:
        return False


class StandInEnvs:
    """SGLang's `envs`: every switch reads False."""

    def __getattr__(self, name: str) -> _Switch:
        return _Switch(False)


def host_names(release: str, capability: tuple[int, int]) -> dict[str, Any]:
    """Every module-level name the selection code may read, for a CUDA host of `capability`."""
    predicates = device_predicates(release, capability)
    platform = StandInPlatform(capability)
    return {
        **predicates,
        "is_npu": lambda: False,
        "is_musa": lambda: False,
        "is_cpu": lambda: False,
        "is_mps": lambda: False,
        "use_mlx": lambda: False,
        "cpu_has_amx_support": lambda: False,
        "get_bool_env_var": lambda name, default="false": False,
        "get_nvidia_driver_version": lambda: (580, 0),
        "is_triton_kernels_available": lambda: True,
        "get_platform": lambda: platform,
        "envs": StandInEnvs(),
        "logger": logging.getLogger("sglpatch.stand_in"),
    }


def find_statement(source: bytes, wanted: Callable[[ast.stmt], bool], what: str) -> ast.stmt:
    """The one statement (at any depth) for which `wanted` holds."""
    found = [n for n in ast.walk(syntax.tree(source)) if isinstance(n, ast.stmt) and wanted(n)]
    if len(found) != 1:
        raise LookupError(f"expected one {what}, found {len(found)}")
    return found[0]


def run_statement(
    statement: ast.stmt, names: Mapping[str, Any], local_names: Mapping[str, Any]
) -> dict[str, Any]:
    """Execute one statement cut out of a function, as the body of a function of `local_names`.

    Returns the locals afterwards. Every global it reads must be in `names`: a missing one
    raises NameError from the code under test instead of reading a made-up value.
    """
    args = list(local_names)
    body: list[ast.stmt] = [
        statement,
        ast.Return(ast.Call(ast.Name("locals", ast.Load()), [], [])),
    ]
    function = ast.FunctionDef(
        name="_selection",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(a) for a in args],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    if sys.version_info >= (3, 12):
        function.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict[str, Any] = dict(names)
    exec(compile(module, "<selection>", "exec"), namespace)
    with mock.patch.dict(sys.modules, _import_stand_ins(statement, names)):
        result = namespace["_selection"](*local_names.values())
    assert isinstance(result, dict)
    return result


def _import_stand_ins(statement: ast.stmt, names: Mapping[str, Any]) -> dict[str, Any]:
    """Modules for the statement's own `from X import y` lines, serving `y` from `names`
    (0.5.15 imports `envs` inside the MoE choice). A name not in `names` is not served."""
    modules: dict[str, Any] = {}
    for node in ast.walk(statement):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            for i in range(1, len(parts) + 1):
                modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
            for alias in node.names:
                if alias.name in names:
                    setattr(modules[node.module], alias.name, names[alias.name])
    return modules


def load_function(source: bytes, name: str, names: Mapping[str, Any]) -> Callable[..., Any]:
    """A module-level function compiled alone, with the module-level assignments it reads
    (e.g. `_is_sm100_supported = is_cuda() and is_sm100_supported()`) evaluated from `names`."""
    tree = syntax.tree(source)
    definitions = _top_level_definitions(tree)
    function = definitions.get(name)
    if not isinstance(function, ast.FunctionDef):
        raise LookupError(f"no function {name}")
    body: list[ast.stmt] = [
        definitions[free]
        for free in sorted(_free_names(function))
        if free not in names and isinstance(definitions.get(free), ast.Assign)
    ]
    body.append(function)
    namespace: dict[str, Any] = dict(names)
    exec(compile(ast.Module(body=body, type_ignores=[]), name, "exec"), namespace)
    result = namespace[name]
    assert callable(result)
    return typing.cast(Callable[..., Any], result)


@dataclass
class Swizzle:
    """What `_swizzle_mxfp4` asked triton_kernels for."""

    layout: str  # "strided" or "default"
    constraints: dict[str, Any]


@contextmanager
def stand_in_triton_kernels() -> Iterator[mock.MagicMock]:
    """Recording stand-ins for the triton_kernels modules `_swizzle_mxfp4` imports."""
    root = mock.MagicMock(name="triton_kernels")
    modules = {
        "triton_kernels": root,
        "triton_kernels.matmul_ogs_details": root.matmul_ogs_details,
        "triton_kernels.matmul_ogs_details.opt_flags": root.matmul_ogs_details.opt_flags,
        "triton_kernels.numerics": root.numerics,
        "triton_kernels.tensor": root.tensor,
        "triton_kernels.tensor_details": root.tensor_details,
        "triton_kernels.tensor_details.layout": root.tensor_details.layout,
    }
    layout = root.tensor_details.layout
    layout.make_default_matmul_mxfp4_w_layout.return_value = ("default-value-layout", {})
    layout.make_default_matmul_mxfp4_w_scale_layout.return_value = ("default-scale-layout", {})
    layout.StridedLayout = "strided-layout"
    with mock.patch.dict(sys.modules, modules):
        yield root


def run_swizzle(
    source: bytes, release: str, capability: tuple[int, int], extra: Mapping[str, Any] = {}
) -> Swizzle:
    """Call the release's `_swizzle_mxfp4` (from `source`) on a stand-in device."""
    names = {**host_names(release, capability), "torch": stand_in_torch(capability), **extra}
    swizzle = load_function(source, "_swizzle_mxfp4", names)
    with stand_in_triton_kernels() as triton_kernels:
        swizzle(mock.MagicMock(name="weight"), mock.MagicMock(name="scale"), 4)
    constraints: dict[str, Any] = {}
    for call in triton_kernels.matmul_ogs_details.opt_flags.update_opt_flags_constraints.mock_calls:
        constraints.update(call.args[0])
    layouts = [c.args[1] for c in triton_kernels.tensor.convert_layout.mock_calls]
    if layouts == ["strided-layout", "strided-layout"]:  # the weight's, then the scale's
        return Swizzle("strided", constraints)
    assert layouts == ["default-value-layout", "default-scale-layout"], layouts
    return Swizzle("default", constraints)


def releases(first: str, last: str) -> list[str]:
    """The cached releases from `first` to `last`, both included."""
    start, stop = wheels.RELEASES.index(first), wheels.RELEASES.index(last)
    return wheels.RELEASES[start : stop + 1]
