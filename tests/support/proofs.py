"""Run what a patch produced: evaluate tables, drive the communicator and the Kimi methods.

Nothing here imports torch or SGLang: the modules under test are executed from their (patched)
source with recording stand-ins for everything they import.
"""

from __future__ import annotations

import ast
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from tests.support import syntax

SIZES_MODULE = "sglang.srt.distributed.device_communicators.all_reduce_utils"
MiB = 1024 * 1024


def size_table(source: bytes, name: str) -> dict[int, dict[int, int]]:
    """Execute all_reduce_utils.py (plain constants) and return the named table."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "all_reduce_utils.py", "exec"), namespace)
    table = namespace[name]
    assert isinstance(table, dict)
    return table


@dataclass
class Run:
    """What the communicator did for one (capability, world size)."""

    enabled: bool
    max_size: int | None
    kernel: str | None  # "multimem", "two_shot" or None when all_reduce declined
    rendezvous: bool = False  # the buffer was allocated and exchanged (the communicator built)


class _Envs:
    """SGLang's `envs`: every optional behaviour switched off."""

    def __getattr__(self, name: str) -> Any:
        return types.SimpleNamespace(get=lambda: False)


@contextmanager
def _stand_ins(
    source: bytes, sizes: bytes, capability: int, world_size: int, multicast: bool
) -> Iterator[mock.MagicMock]:
    """Fake every module the communicator imports; the size table is the real (patched) one."""
    torch = mock.MagicMock(name="torch")
    torch.cuda.get_device_capability.return_value = (capability, 0)
    torch.distributed.get_world_size.return_value = world_size
    torch.bfloat16.itemsize = 2
    symm = torch.distributed._symmetric_memory
    # Without NVLink multicast (every capability-12 part) the rendezvous hands back a null
    # multicast pointer; with it (NVSwitch systems such as B200), a real address.
    symm.rendezvous.return_value.multicast_ptr = 0x7F0000000000 if multicast else 0
    fakes: dict[str, Any] = {}
    for node in ast.walk(syntax.tree(source)):
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        )  # fmt: skip
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                fakes.setdefault(".".join(parts[:i]), None)
    modules: dict[str, Any] = {}
    for name in sorted(fakes, key=lambda n: n.count(".")):
        if name == "torch":
            modules[name] = torch
        elif name.startswith("torch."):
            parent, _, child = name.rpartition(".")
            modules[name] = getattr(modules[parent], child)
        elif name in ("logging", "typing", "os", "functools", "contextlib", "enum", "dataclasses"):
            continue
        elif name == SIZES_MODULE:
            sizes_module = types.ModuleType(name)
            exec(compile(sizes, "all_reduce_utils.py", "exec"), sizes_module.__dict__)
            modules[name] = sizes_module
        else:
            modules[name] = mock.MagicMock(name=name)
            if name == "sglang.srt.utils":
                modules[name].is_cuda.return_value = True
                modules[name].is_hip.return_value = False
            if name == "sglang.srt.environ":
                modules[name].envs = _Envs()
    with mock.patch.dict(sys.modules, modules):
        yield torch


def communicator_run(
    source: bytes,
    sizes: bytes,
    class_name: str,
    capability: int,
    world_size: int,
    multicast: bool = True,
) -> Run:
    """Build the communicator on a stand-in device and all-reduce one small bf16 tensor.

    `multicast` is whether the GPUs share NVLink multicast memory. Raises what the real code
    raises, e.g. `KeyError: 12` from an unpatched table.
    """
    with _stand_ins(source, sizes, capability, world_size, multicast) as torch:
        module = types.ModuleType("communicator_under_test")
        exec(compile(source, "communicator.py", "exec"), module.__dict__)
        communicator = getattr(module, class_name)(group=mock.MagicMock(), device=0)
        built = torch.distributed._symmetric_memory.rendezvous.called
        if communicator.disabled:
            return Run(False, getattr(communicator, "max_size", None), None, built)
        tensor = mock.MagicMock(name="tensor")
        tensor.dtype = communicator.dtype
        tensor.device = communicator.device
        tensor.numel.return_value = 1024
        tensor.element_size.return_value = 2
        communicator.all_reduce(tensor)
        kernels = torch.ops.symm_mem
        used = [k for k in ("multimem", "two_shot") if getattr(kernels, f"{k}_all_reduce_").called]
        return Run(True, communicator.max_size, used[0] if used else None, built)


def model_methods(source: bytes, class_name: str, names: typing.Iterable[str]) -> type:
    """A class holding just the named methods of `class_name`, compiled from the source."""
    tree = syntax.tree(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    wanted = set(names)
    body: list[ast.stmt] = [
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in wanted
    ]
    missing = wanted - {n.name for n in body}  # type: ignore[attr-defined]
    if missing:
        raise AttributeError(f"{class_name} has no {', '.join(sorted(missing))}")
    holder = ast.ClassDef(name=class_name, bases=[], keywords=[], body=body, decorator_list=[])
    if sys.version_info >= (3, 12):
        holder.type_params = []
    stripped = ast.Module(body=[holder], type_ignores=[])
    namespace: dict[str, Any] = {**vars(typing), "torch": mock.MagicMock(name="torch")}
    exec(compile(ast.fix_missing_locations(stripped), "model.py", "exec"), namespace)
    result = namespace[class_name]
    assert isinstance(result, type)
    return result


def drive_eagle3_interface(cls: type) -> Mapping[str, Any]:
    """Call each EAGLE-3 method on an instance whose language_model records the calls."""
    instance = cls.__new__(cls)
    language_model = mock.MagicMock(name="language_model")
    language_model.get_embed_and_head.return_value = ("embed", "head")
    instance.language_model = language_model
    returned = instance.get_embed_and_head()
    instance.set_embed_and_head("new-embed", "new-head")
    instance.set_eagle3_layers_to_capture([2, 30, 57])
    instance.set_eagle3_layers_to_capture()
    return {"returned": returned, "language_model": language_model}
