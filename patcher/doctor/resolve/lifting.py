"""An SGLang module whose names are defined on first use, each by running the statements of the
real module that define it (and, first, those its free names need)."""

from __future__ import annotations

import ast
import logging
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from sglpatch.doctor.resolve import disk_cache
from sglpatch.doctor.resolve.files import parsed
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


Statement = tuple[types.CodeType, set[str], set[str], set[str]]  # code, needs now, later, binds
_ANALYSIS = Path(__file__).read_bytes()  # the code that computes an entry is part of its name


class _Analysed:
    """One module's top-level statements: which binds each name, and those compiled so far
    (each with the names it needs now and later and those it binds), kept on disk between
    runs; the module is parsed only for a statement not compiled before."""

    def __init__(self, source: bytes, filename: str) -> None:
        self.source, self.filename = source, filename
        self.entry = disk_cache.name(_ANALYSIS, filename.encode(), source)
        self.tree: ast.Module | None = None
        self.new = False  # statements compiled here that the disk does not hold
        kept = _valid(disk_cache.load(self.entry))
        if kept is not None:
            self.where, self.statements = kept
            return
        self.where = {}
        self.statements = {}
        for number, statement in enumerate(self._tree().body):
            for name in _defines(statement):
                self.where.setdefault(name, []).append(number)
        self.new = True

    def _tree(self) -> ast.Module:
        if self.tree is None:
            self.tree = parsed(self.source)
        return self.tree

    def statement(self, number: int) -> Statement:
        found = self.statements.get(number)
        if found is None:
            statement = self._tree().body[number]
            now, later = _needs(statement)
            code = compile(ast.Module(body=[statement], type_ignores=[]), self.filename, "exec")
            found = self.statements[number] = (code, now, later, _defines(statement))
            self.new = True
        return found

    def keep(self) -> None:
        """Saves what was compiled here, with what another run saved meanwhile."""
        if not self.new:
            return
        kept = _valid(disk_cache.load(self.entry))
        statements = {**kept[1], **self.statements} if kept is not None else self.statements
        disk_cache.save(self.entry, (self.where, statements))
        self.new = False


def _valid(kept: object) -> tuple[dict[str, list[int]], dict[int, Statement]] | None:
    """A loaded entry of the shape `keep` writes, or None."""
    if not (isinstance(kept, tuple) and len(kept) == 2):
        return None
    where, statements = kept
    if not (isinstance(where, dict) and isinstance(statements, dict)):
        return None
    for value in statements.values():
        if not (isinstance(value, tuple) and len(value) == 4):
            return None
        if not isinstance(value[0], types.CodeType):
            return None
    return where, statements


_ANALYSED: dict[tuple[bytes, str], _Analysed] = {}  # a release's modules, patched copies beside


def _analysed(source: bytes, filename: str) -> _Analysed:
    found = _ANALYSED.get((source, filename))
    if found is None:
        if len(_ANALYSED) >= 1024:
            keep_analyses()
            _ANALYSED.clear()
        found = _ANALYSED[source, filename] = _Analysed(source, filename)
    return found


def keep_analyses() -> None:
    """Saves to disk what this process compiled (at the end of a survey's work)."""
    for analysed in _ANALYSED.values():
        analysed.keep()


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
        where = self._analysed().where
        if attribute in where:
            self._run(where[attribute], set())
            if attribute in self.__dict__:
                return self.__dict__[attribute]
        submodule = self._sandbox.submodule(self.__name__, attribute)
        if submodule is not None:
            return submodule
        return Unknown(f"{self.__name__}.{attribute}")

    def _analysed(self) -> _Analysed:
        return _analysed(self._source, self.__file__ or self.__name__)

    def _run(self, numbers: list[int], seen: set[int]) -> None:
        """Run the statements defining a name: first those the definition itself needs (a base
        class, a decorator, a default), then it, then those its function bodies will read."""
        analysed = self._analysed()
        where = analysed.where
        for number in numbers:
            if number in self._done or number in seen:
                continue
            seen.add(number)
            code, now, later, own = analysed.statement(number)
            for free in sorted(now - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], seen)
            self._done.add(number)
            try:
                exec(code, self.__dict__)
            except Exception as error:  # a conditional import or a probe of absent hardware
                logging.getLogger("sglpatch.doctor.resolve").debug(
                    "%s: statement %d: %s", self.__name__, number, error
                )
            for free in sorted(later - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], set())


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
