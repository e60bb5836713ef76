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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tests.support import syntax
from tests.support.stand_in_machine import (
    STUBBED,
    Anything,
    DeepGemm,
    Envs,
    Machine,
    Platform,
    env_defaults,
    helpers,
)

# What the tests take from here with the runs themselves.
__all__ = ["DeepGemm", "Machine", "configurer_flags", "fp8_linear_choice"]

SM120_DEEP_GEMM_APIS = (
    "fp8_einsum",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "transform_sf_into_required_layout",
)


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
        if attribute in STUBBED:
            return STUBBED[attribute]
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
    envs = Envs(env_defaults(release), dict(machine.env))
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
            platform = Platform(release, probes)
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
