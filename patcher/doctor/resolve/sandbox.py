"""The import system's side: the modules of one release on one stand-in device, each run whole
(the resolution), lifted (the rest of SGLang) or stood in for (torch, third-party modules).

The sandbox is a finder on `sys.meta_path` only while `active()`; the modules it made are kept
aside between uses and whatever `sys.modules` held under the same names is put back after."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sglpatch.doctor.resolve import disk_cache
from sglpatch.doctor.resolve.files import ReleaseFiles
from sglpatch.doctor.resolve.lifting import LiftedModule
from sglpatch.doctor.resolve.msgspec_stand_in import msgspec_module
from sglpatch.doctor.resolve.stand_ins import (
    STUBBED,
    Capability,
    CudaPlatform,
    StandInModule,
    arm64_host,
    device_name,
    stand_in_torch,
)

# Modules run whole: the resolution itself.
RUN_WHOLE = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.environ")
# Third-party modules imported for real (pure Python, installed in the dev environment).
REAL_THIRD_PARTY = ("packaging", "typing_extensions")
COMMON = "sglang.srt.utils.common"


class Sandbox(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The modules of one release, on one stand-in device, with some files replaced."""

    def __init__(
        self,
        files: ReleaseFiles,
        capability: Capability,
        replaced: Mapping[str, bytes] = {},
        model: Callable[[], Any] | None = None,
    ) -> None:
        self.files = files
        self.capability = capability
        self.replaced = dict(replaced)
        self.model = model
        self.installed = files.installed
        self.kept: dict[str, types.ModuleType] = {}
        self.serving = False  # within `active()`

    # The release's files.
    def _file(self, name: str) -> tuple[str, bool] | None:
        path = name.replace(".", "/")
        if self.files.exists(f"{path}/__init__.py"):
            return f"{path}/__init__.py", True
        if self.files.exists(f"{path}.py"):
            return f"{path}.py", False
        return None

    def source(self, path: str) -> bytes:
        return self.replaced.get(path) or self.files.read(path)

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
            exec(_compiled(self.source(path), path), module.__dict__)

    def _common_preset(self) -> dict[str, Any]:
        capability = self.capability
        return {
            **STUBBED,
            "is_flashinfer_available": lambda: True,  # every wheel requires flashinfer_python
            "is_triton_kernels_available": lambda: True,
            "get_device_name": lambda device_id=0: device_name(capability),
            "get_nvidia_driver_version": lambda: (580, 0),
            "check_pkg_version_at_least": lambda pkg, version: True,
            "get_device_memory_capacity": lambda device=None: 96 * 1024,
            "is_host_cpu_arm64": lambda: arm64_host(capability),
            "use_mlx": lambda: False,
        }

    @contextmanager
    def active(self) -> Iterator[Sandbox]:
        """Serve this release's modules (kept between uses); the environment is restored after
        each use, since SGLang's `envs.X.set()` writes os.environ. Within a use, a nested use
        (one model of many) restores the environment only."""

        if self.serving:
            environ = _environ()
            try:
                yield self
            finally:
                _restore(environ)
            return
        saved = {n: m for n, m in sys.modules.items() if n == "torch" or n.startswith(_ROOTS)}
        for name in saved:
            del sys.modules[name]
        sys.modules.update(self.kept)
        environ = _environ()
        sys.meta_path.insert(0, self)
        self.serving = True
        try:
            yield self
        finally:
            self.serving = False
            sys.meta_path.remove(self)
            _restore(environ)
            self.kept = {n: m for n, m in list(sys.modules.items()) if _ours(m, self)}
            for name in self.kept:
                del sys.modules[name]
            sys.modules.update(saved)


def _environ() -> dict[Any, Any]:
    """os.environ as it stands: its encoded pairs where CPython keeps them (copying those
    decodes nothing: an evaluation's snapshot cost more than the evaluation's own steps)."""
    return dict(getattr(os.environ, "_data", os.environ))


def _restore(environ: dict[Any, Any]) -> None:
    """os.environ as `environ` held it: only the variables that changed are set or unset (the
    release sets a few; clearing and refilling all of them took a third of an evaluation)."""
    now: Any = getattr(os.environ, "_data", os.environ)
    if now == environ:
        return
    decoded = now is not os.environ
    key: Callable[[Any], str] = os.environ.decodekey if decoded else str
    value: Callable[[Any], str] = os.environ.decodevalue if decoded else str
    for name in [n for n in now if n not in environ]:
        del os.environ[key(name)]
    for name, held in environ.items():
        if now.get(name) != held:
            os.environ[key(name)] = value(held)


@functools.lru_cache(maxsize=512)
def _compiled(source: bytes, path: str) -> types.CodeType:
    """A module run whole, compiled once for every sandbox, and kept between runs
    (server_args.py is 300 kB: compiling it took most of a sandbox's start)."""
    entry = disk_cache.name(_SELF, path.encode(), source)
    kept = disk_cache.load(entry)
    if isinstance(kept, types.CodeType):
        return kept
    code = compile(source, path, "exec")
    disk_cache.save(entry, code)
    return code


_SELF = Path(__file__).read_bytes()  # how a module run whole is compiled: part of its entry


def run_whole(name: str) -> bool:
    return any(name == whole or name.startswith(whole + ".") for whole in RUN_WHOLE)


_ROOTS = ("sglang", "torch.", "flashinfer", "transformers", "triton", "sgl_kernel", "deep_gemm")


def _ours(module: Any, sandbox: Sandbox) -> bool:
    spec = vars(module).get("__spec__")  # not getattr: a lifted module would lift it
    return spec is not None and spec.loader is sandbox
