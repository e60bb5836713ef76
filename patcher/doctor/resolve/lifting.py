"""An SGLang module whose names are defined on first use, each by running the statements of the
real module that define it (and, first, those its free names need)."""

from __future__ import annotations

import ast
import functools
import logging
import types
from collections.abc import Mapping
from typing import Any, Protocol

from sglpatch.doctor.resolve.stand_ins import Unknown


class Submodules(Protocol):
    """What a lifted module asks its sandbox for: a submodule of a package, if it has one."""

    def submodule(self, package: str, name: str) -> types.ModuleType | None: ...


def _defines(statement: ast.stmt) -> set[str]:
    """The module-level names one top-level statement binds."""
    names: set[str] = set()
    nodes: list[ast.AST] = [statement]
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        nodes.extend(ast.iter_child_nodes(node))
    return names


def _loads(statement: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)}


@functools.lru_cache(maxsize=1024)  # a release's lifted modules, patched copies beside
def _index(source: bytes) -> tuple[ast.Module, dict[str, list[int]]]:
    tree = ast.parse(source)
    where: dict[str, list[int]] = {}
    for number, statement in enumerate(tree.body):
        for name in _defines(statement):
            where.setdefault(name, []).append(number)
    return tree, where


class LiftedModule(types.ModuleType):
    """An SGLang module whose names are defined on first use from its real source."""

    def __init__(
        self, name: str, source: bytes, sandbox: Submodules, preset: Mapping[str, Any]
    ) -> None:
        super().__init__(name)
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_done", set())
        self.__dict__.update(preset)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        tree, where = _index(self._source)
        if attribute in where:
            self._run(where[attribute], tree, set())
            if attribute in self.__dict__:
                return self.__dict__[attribute]
        submodule = self._sandbox.submodule(self.__name__, attribute)
        if submodule is not None:
            return submodule
        return Unknown(f"{self.__name__}.{attribute}")

    def _run(self, numbers: list[int], tree: ast.Module, seen: set[int]) -> None:
        """Run the statements defining a name: first those the definition itself needs (a base
        class, a decorator, a default), then it, then those its function bodies will read."""
        _, where = _index(self._source)
        for number in numbers:
            if number in self._done or number in seen:
                continue
            seen.add(number)
            code, now, later, own = _statement(self._source, number, self.__file__ or self.__name__)
            for free in sorted(now - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], tree, seen)
            self._done.add(number)
            try:
                exec(code, self.__dict__)
            except Exception as error:  # a conditional import or a probe of absent hardware
                logging.getLogger("sglpatch.doctor.resolve").debug(
                    "%s: statement %d: %s", self.__name__, number, error
                )
            for free in sorted(later - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], tree, set())


@functools.lru_cache(maxsize=16384)
def _statement(
    source: bytes, number: int, filename: str
) -> tuple[types.CodeType, set[str], set[str], set[str]]:
    """One top-level statement compiled, with the names it needs now and later and those it
    binds: the same for every sandbox that lifts it (each capability, each patch tried)."""
    statement = _index(source)[0].body[number]
    now, later = _needs(statement)
    code = compile(ast.Module(body=[statement], type_ignores=[]), filename, "exec")
    return code, now, later, _defines(statement)


def _needs(statement: ast.stmt) -> tuple[set[str], set[str]]:
    """The names a statement reads when it runs, and those only its function bodies read."""
    now: set[str] = set()
    later: set[str] = set()

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            head: list[ast.AST] = [*node.args.defaults, *node.args.kw_defaults]  # type: ignore[list-item]
            if not isinstance(node, ast.Lambda):
                head += node.decorator_list
            for part in head:
                if part is not None:
                    visit(part, deferred)
            body = node.body if isinstance(node.body, list) else [node.body]
            for part in body:
                visit(part, True)
            return
        if isinstance(node, ast.Name):
            (later if deferred else now).add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, deferred)

    visit(statement, False)
    return now, later - now
