"""Finding patches: every `Patch` subclass in the modules of `sglpatch.patches` (one per module)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterable
from types import ModuleType

from packaging.version import Version

from sglpatch.errors import SglpatchError
from sglpatch.patch import Patch


class CatalogueError(SglpatchError):
    """A patch module is malformed; this is a defect in that module, not in the target."""


def patch_in(module: ModuleType) -> type[Patch]:
    """The one concrete `Patch` subclass a patch module defines."""
    found = [
        obj
        for obj in vars(module).values()
        # Modules first: touching a lazily imported one (libcst) would load it.
        if not isinstance(obj, ModuleType)
        and isinstance(obj, type)
        and issubclass(obj, Patch)
        and obj.__module__ == module.__name__
        and not getattr(obj, "__abstractmethods__", None)
    ]
    if len(found) != 1:
        raise CatalogueError(f"{module.__name__} defines {len(found)} patches; expected one")
    return found[0]


def builtin_modules() -> list[ModuleType]:
    package = importlib.import_module("sglpatch.patches")
    return [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    ]


def load(modules: Iterable[ModuleType] | None = None) -> list[Patch]:
    """Instantiate the catalogue, checking each declaration; sorted by id."""
    patches = [patch_in(m)() for m in (builtin_modules() if modules is None else modules)]
    seen: set[str] = set()
    for patch in patches:
        validate(patch)
        if patch.id in seen:
            raise CatalogueError(f"two patches use the id {patch.id!r}")
        seen.add(patch.id)
    return sorted(patches, key=lambda p: p.id)


def validate(patch: Patch) -> None:
    cls = type(patch)
    problems = []
    if (
        not getattr(cls, "id", "")
        or not cls.id.replace("-", "").isalnum()
        or cls.id != cls.id.lower()
    ):
        problems.append("id must be lower-case letters, digits and dashes")
    if not getattr(cls, "description", "") or "\n" in cls.description:
        problems.append("description must be one line")
    if not str(getattr(cls, "tested", "")):
        problems.append("tested must be a non-empty specifier set")
    if cls.fixed_upstream_in is not None and not isinstance(cls.fixed_upstream_in, Version):
        problems.append("fixed_upstream_in must be a Version")
    if not (cls.__doc__ or "").strip() or not (cls.__module__ and _module_doc(cls)):
        problems.append("the class and its module need docstrings saying why it exists")
    if problems:
        raise CatalogueError(f"patch {cls.__module__}.{cls.__name__}: {'; '.join(problems)}")


def _module_doc(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    return module is not None and bool((module.__doc__ or "").strip())
