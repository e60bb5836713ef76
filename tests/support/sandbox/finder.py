"""The import system's side: the modules of one release on one stand-in device, each run whole
(the resolution), lifted (the rest of SGLang) or stood in for (torch, third-party modules)."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tests.support import wheels
from tests.support.sandbox.lifting import LiftedModule
from tests.support.sandbox.msgspec_stand_in import msgspec_module
from tests.support.sandbox.stand_ins import (
    DEVICE_NAMES,
    Capability,
    CudaPlatform,
    StandInModule,
    stand_in_torch,
)

# Modules run whole: the resolution itself.
RUN_WHOLE = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.environ")
# Third-party modules imported for real (pure Python, installed in the dev environment).
REAL_THIRD_PARTY = ("packaging", "typing_extensions")
COMMON = "sglang.srt.utils.common"

# Import names of requirements whose distribution is named otherwise.
_IMPORT_NAMES = {"flashinfer_python": "flashinfer", "sglang_kernel": "sgl_kernel",
                 "nvidia_cutlass_dsl": "cutlass", "pillow": "PIL", "pyyaml": "yaml"}  # fmt: skip


@functools.cache
def _installed(release: str) -> frozenset[str]:
    """The top-level modules an install of `release` has: its unconditional requirements
    (the wheel's METADATA) and torch."""
    import re

    (metadata,) = [n for n in wheels.members(release, "") if n.endswith(".dist-info/METADATA")]
    names = {"torch", "triton", "transformers", "sgl_kernel", "flashinfer"}
    for line in wheels.member(release, metadata).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            found = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)", line)
            if found:
                name = re.sub(r"[-.]", "_", found.group(1)).lower()
                names.add(_IMPORT_NAMES.get(name, name))
    return frozenset(names)


class Sandbox(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The modules of one release, on one stand-in device, with some files replaced."""

    def __init__(
        self,
        release: str,
        capability: Capability,
        replaced: Mapping[str, bytes] = {},
        model: Callable[[], Any] | None = None,
    ) -> None:
        self.release = release
        self.capability = capability
        self.replaced = dict(replaced)
        self.model = model
        self.files = set(wheels.members(release))
        self.installed = _installed(release)
        self.kept: dict[str, types.ModuleType] = {}

    # The wheel's files.
    def _file(self, name: str) -> tuple[str, bool] | None:
        path = name.replace(".", "/")
        if f"{path}/__init__.py" in self.files:
            return f"{path}/__init__.py", True
        if f"{path}.py" in self.files:
            return f"{path}.py", False
        return None

    def source(self, path: str) -> bytes:
        return self.replaced.get(path) or wheels.member(self.release, path)

    def submodule(self, package: str, name: str) -> types.ModuleType | None:
        if self._file(f"{package}.{name}") is None:
            return None
        return importlib.import_module(f"{package}.{name}")

    # The import system's side.
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        root = fullname.split(".")[0]
        if root in sys.stdlib_module_names or root in REAL_THIRD_PARTY:
            return None
        if root != "sglang" and root not in self.installed:
            return None  # not installed with SGLang: the import fails as it would there
        found = self._file(fullname) if root == "sglang" else None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=bool(found and found[1]) or found is None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name == "torch":
            module: types.ModuleType = stand_in_torch(self.capability)
        elif name.startswith("torch."):
            module = getattr(sys.modules["torch"], name.split(".", 1)[1], None) or (
                StandInModule(name)
            )
            if not isinstance(module, types.ModuleType):
                module = StandInModule(name)
        elif name in ("msgspec", "msgspec.structs"):
            module = msgspec_module() if name == "msgspec" else sys.modules["msgspec"].structs
        elif name == "sglang.srt.platforms":
            module = types.ModuleType(name)
            module.current_platform = CudaPlatform()  # type: ignore[attr-defined]
        elif name.split(".")[0] != "sglang" or self._file(name) is None:
            module = StandInModule(name)
        elif run_whole(name):
            module = types.ModuleType(name)
        else:
            path, _ = self._file(name)  # type: ignore[misc]
            preset = {"__file__": path, "__name__": name}
            if name == COMMON and "sglang.srt.utils" in sys.modules:
                return sys.modules["sglang.srt.utils"]
            if name == "sglang.srt.utils":  # its __init__ re-exports common: one module for both
                path = COMMON.replace(".", "/") + ".py"
                preset = {"__file__": path, "__name__": name} | self._common_preset()
            if name == "sglang.srt.configs.model_config" and self.model is not None:
                model = self.model
                preset["ModelConfig"] = type(
                    "ModelConfig", (), {"from_server_args": staticmethod(lambda *a, **k: model())}
                )
            module = LiftedModule(name, self.source(path), self, preset)
            if name == "sglang.srt.utils":
                module.__path__ = []
                return module
        found = self._file(name)
        if found is not None:
            module.__file__ = found[0]
        if found is None or found[1]:
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if run_whole(name) and not isinstance(module, (LiftedModule, StandInModule)):
            path = module.__file__ or ""
            code = compile(self.source(path), path, "exec")
            exec(code, module.__dict__)

    def _common_preset(self) -> dict[str, Any]:
        from tests.support.stand_in_machine import STUBBED

        capability = self.capability
        return {
            **STUBBED,
            "is_flashinfer_available": lambda: True,  # every wheel requires flashinfer_python
            "is_triton_kernels_available": lambda: True,
            "get_device_name": lambda device_id=0: DEVICE_NAMES[capability],
            "get_nvidia_driver_version": lambda: (580, 0),
            "check_pkg_version_at_least": lambda pkg, version: True,
            "get_device_memory_capacity": lambda device=None: 96 * 1024,
            "is_host_cpu_arm64": lambda: capability == (12, 1),
            "use_mlx": lambda: False,
        }

    @contextmanager
    def active(self) -> Iterator[Sandbox]:
        """Serve this release's modules (kept between uses); the environment is restored after
        each use, since SGLang's `envs.X.set()` writes os.environ."""
        import os

        saved = {n: m for n, m in sys.modules.items() if n == "torch" or n.startswith(_ROOTS)}
        for name in saved:
            del sys.modules[name]
        sys.modules.update(self.kept)
        environ = dict(os.environ)
        sys.meta_path.insert(0, self)
        try:
            yield self
        finally:
            sys.meta_path.remove(self)
            os.environ.clear()
            os.environ.update(environ)
            self.kept = {n: m for n, m in list(sys.modules.items()) if _ours(m, self)}
            for name in self.kept:
                del sys.modules[name]
            sys.modules.update(saved)


def run_whole(name: str) -> bool:
    return any(name == whole or name.startswith(whole + ".") for whole in RUN_WHOLE)


_ROOTS = ("sglang", "torch.", "flashinfer", "transformers", "triton", "sgl_kernel", "deep_gemm")


def _ours(module: Any, sandbox: Sandbox) -> bool:
    spec = vars(module).get("__spec__")  # not getattr: a lifted module would lift it
    return spec is not None and spec.loader is sandbox
