"""Run a release's DeepGEMM configurer and FP8 block-GEMM dispatch on a stand-in machine.

Nothing here imports torch, SGLang, DeepGEMM or FlashInfer. The module under test (configurer.py,
fp8_utils.py; patched or not) is executed from its source. What it imports is faked, except the
capability probes it decides with: `is_sm100_supported`, `is_blackwell_supported`, `get_device_sm`,
... are the release's OWN definitions, lifted out of its `sglang/srt/utils/common.py` and run
against a stand-in `torch.cuda`, and `get_platform()` (0.5.19+) maps its facts onto those probes
through the release's own `_PLATFORM_PROBES` table. So "which path does capability 12.1 take on
0.5.9" is answered by 0.5.9's code, not by what we believe 0.5.9's helpers say.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal
from unittest import mock

from tests.support import syntax, wheels

COMMON = "sglang/srt/utils/common.py"
ENVIRON = "sglang/srt/environ.py"
RUNTIME_CONTEXT = "sglang/srt/runtime_context.py"

# The DeepGEMM installed next to SGLang. "hopper-blackwell": a build with SM90/SM100 kernels only
# (every DeepGEMM the releases before 0.5.20 shipped against); "sm120": a build exposing the SM120
# entry points 0.5.20/0.5.21 probe for (DeepGEMM#324).
DeepGemm = Literal["absent", "hopper-blackwell", "sm120"]
SM120_DEEP_GEMM_APIS = (
    "fp8_einsum",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "transform_sf_into_required_layout",
)

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
def _env_defaults_cached(release: str) -> dict[str, Any]:
    return _env_defaults(release)


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
        if name in seen or name in _STUBBED:
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


# Probes a CUDA box answers without looking at the capability: not an AMD, Intel, Moore Threads
# or Ascend part, not the CPU engine, and no NVML shortcut (the capability comes from torch.cuda).
_STUBBED = {
    "is_musa": lambda: False,
    "is_npu": lambda: False,
    "is_xpu": lambda: False,
    "is_hpu": lambda: False,
    "is_cpu": lambda: False,
    "is_fp8_fnuz": lambda: False,
    "is_gfx95_supported": lambda: False,
    "is_gfx942_supported": lambda: False,
    "is_npu_arch35": lambda: False,
    "is_gfx1250_supported": lambda: False,
    "_get_device_sm_via_nvml": lambda: None,
}


def _env_defaults(release: str) -> dict[str, Any]:
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
        **_STUBBED,
    }
    exec(_probe_code(release), namespace)
    return namespace


class _Envs:
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


class _Platform:
    """`get_platform()`: each fact is the probe the release's `_PLATFORM_PROBES` names."""

    def __init__(self, release: str, probes: Mapping[str, Any]) -> None:
        self._table, self._probes = _platform_table(release), probes

    def __getattr__(self, name: str) -> Any:
        return self._probes[self._table[name]]()


def _fake_module(name: str, known: Mapping[str, Any]) -> types.ModuleType:
    """A module holding `known`; any other name is an `Anything`, except predicates.

    A predicate we did not lift or stub (`is_npu_arch35`, `get_device_sm`) would answer with a
    truthy `Anything` and steer the code under test silently: it is refused instead.
    """
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in known.items() if not k.startswith("__")})

    def missing(attribute: str) -> Any:
        if attribute.startswith("__"):  # not a package: `from ... import` must not look inside
            raise AttributeError(attribute)
        if attribute in _STUBBED:
            return _STUBBED[attribute]
        if attribute.startswith(("is_", "get_device", "get_cuda")):
            raise AttributeError(f"the stand-in {name} does not know {attribute}")
        return Anything(name=f"{name}.{attribute}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def _deep_gemm(kind: DeepGemm) -> types.ModuleType | None:
    if kind == "absent":
        return None  # `import deep_gemm` raises ImportError
    module = types.ModuleType("deep_gemm")
    module.fp8_gemm_nt = lambda *a, **k: None  # type: ignore[attr-defined]
    if kind == "sm120":
        for api in SM120_DEEP_GEMM_APIS:
            setattr(module, api, lambda *a, **k: None)
    return module


@functools.cache
def _imports(source: bytes) -> list[str]:
    """Every absolute module the source imports, at any depth."""
    imported: set[str] = set()
    for node in ast.walk(syntax.tree(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
    return sorted(imported)


@contextmanager
def _stand_ins(
    source: bytes, release: str, machine: Machine, extra: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    probes = helpers(release, machine)
    envs = _Envs(_env_defaults_cached(release), dict(machine.env))
    modules: dict[str, Any] = {}
    for name in _imports(source):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            modules.setdefault(".".join(parts[:i]), None)
    for name in list(modules):
        root = name.split(".")[0]
        if root in sys.stdlib_module_names or name == "__future__":
            del modules[name]
        elif name in extra:
            modules[name] = extra[name]
        elif name == "torch":
            modules[name] = probes["torch"]
        elif name.startswith("torch."):
            modules[name] = Anything(name=name)
        elif name in ("sglang.srt.utils", "sglang.srt.utils.common"):
            modules[name] = _fake_module(name, probes)
        elif name == "sglang.srt.environ":
            modules[name] = types.SimpleNamespace(envs=envs)
        elif name == "sglang.srt.runtime_context":
            platform = _Platform(release, probes)
            modules[name] = _fake_module(name, {"get_platform": lambda p=platform: p})
        elif name == "deep_gemm" or name.startswith("deep_gemm."):
            modules[name] = _deep_gemm(machine.deep_gemm) if name == "deep_gemm" else Anything()
        else:
            modules[name] = _fake_module(name, {})
    # `import deep_gemm` inside a function looks it up at call time.
    modules.setdefault("deep_gemm", _deep_gemm(machine.deep_gemm))
    with mock.patch.dict(sys.modules, modules):
        yield probes


@functools.cache
def _compiled(source: bytes, filename: str) -> types.CodeType:
    return compile(source, filename, "exec")


DEEP_GEMM_FLAGS = (
    "ENABLE_JIT_DEEPGEMM",
    "DEEPGEMM_BLACKWELL",
    "DEEPGEMM_SCALE_UE8M0",
    "DEEPGEMM_NEED_TMA_ALIGNED_SCALES",
)


def configurer_flags(source: bytes, release: str, machine: Machine) -> dict[str, bool]:
    """Import the configurer on the machine and read the flags the rest of SGLang reads."""
    with _stand_ins(source, release, machine, {}):
        namespace: dict[str, Any] = {"__name__": "configurer_under_test"}
        exec(_compiled(source, "configurer.py"), namespace)
    return {flag: bool(namespace[flag]) for flag in DEEP_GEMM_FLAGS if flag in namespace}


DEEP_GEMM_WRAPPERS = (
    "sglang.srt.layers.deep_gemm_wrapper",
    "sglang.srt.layers.quantization.deep_gemm_wrapper",
)


def _counted(function: Callable[..., Any], name: str, calls: dict[str, int]) -> Callable[..., Any]:
    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return function(*args, **kwargs)

    return counting


def fp8_linear_choice(
    source: bytes,
    release: str,
    machine: Machine,
    deep_gemm_flags: Mapping[str, bool],
    backend: str = "auto",
    called: dict[str, int] | None = None,
) -> str:
    """The block-FP8 linear function fp8_utils dispatches to, by name.

    Starts the way a server does: `initialize_fp8_gemm_config` (0.5.6.post2+) with
    `--fp8-gemm-backend` = `backend`, then `dispatch_w8a8_block_fp8_linear()`. The DeepGEMM
    wrapper it consults carries `deep_gemm_flags` (from `configurer_flags`, patched or not).
    `called` names module functions to count the calls of on the way (name -> calls, filled in).
    """
    wrapper = types.ModuleType("deep_gemm_wrapper")
    wrapper.__dict__.update(deep_gemm_flags)
    extra = {
        **dict.fromkeys(DEEP_GEMM_WRAPPERS, wrapper),
        "sglang.srt.layers": _fake_module("sglang.srt.layers", {"deep_gemm_wrapper": wrapper}),
        "sglang.srt.layers.quantization": _fake_module(
            "sglang.srt.layers.quantization", {"deep_gemm_wrapper": wrapper}
        ),
    }
    # A block-FP8 checkpoint (DeepSeek-V3 style) served with `--fp8-gemm-backend <backend>`.
    server_args = types.SimpleNamespace(fp8_gemm_runner_backend=backend, quantization="fp8")
    with _stand_ins(source, release, machine, extra):
        runtime_context = sys.modules.get("sglang.srt.runtime_context")
        if runtime_context is not None:  # 0.5.19+ read the backend from get_exec()
            runtime_context.get_exec = lambda: types.SimpleNamespace(kernel=server_args)  # type: ignore[attr-defined]
        namespace: dict[str, Any] = {"__name__": "fp8_utils_under_test"}
        exec(_compiled(source, "fp8_utils.py"), namespace)
        counts = called if called is not None else {}
        for name in counts:
            namespace[name] = _counted(namespace[name], name, counts)
        initialize: Callable[..., None] | None = namespace.get("initialize_fp8_gemm_config")
        if initialize is not None:
            params = initialize.__code__.co_argcount
            initialize(*([server_args] if params else []))
        chosen = namespace["dispatch_w8a8_block_fp8_linear"]()
    names = [k for k, v in namespace.items() if v is chosen and not k.startswith("_")]
    if len(names) != 1:
        raise AssertionError(f"dispatch returned {chosen!r}, named {names} in fp8_utils")
    return names[0]
