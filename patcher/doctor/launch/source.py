"""A release's Python source, read as syntax trees and never imported, with a small evaluator
for the literal values its module-level names and argument declarations hold.

SGLang is not importable here (no torch, or the wrong release), so what its parser would be
given is read from the trees: constants, lists, `+` of lists, module-level names (also those
imported from another `sglang` module, followed a few hops), `list(...)` of those. Anything
else is `UNKNOWN`, never a guess.
"""

from __future__ import annotations

import argparse
import ast
import enum
from collections.abc import Callable, Mapping
from pathlib import Path

# A release's files by their path inside site-packages ("sglang/srt/server_args.py");
# None when the release has no such file.
Source = Callable[[str], "bytes | None"]

_HOPS = 4  # imports followed for one name: choices.py re-exported by server_args.py is 1


class Unknown(enum.Enum):
    """A value the source holds but this reader cannot compute (a call, an environment read)."""

    UNKNOWN = "unknown"

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown.UNKNOWN


def directory_source(site_packages: Path) -> Source:
    """The files under an installed release's site-packages folder (or a checkout's `python/`)."""

    def read(name: str) -> bytes | None:
        try:
            return (site_packages / name).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    return read


class Modules:
    """The release's modules, each parsed once, and what their module-level names hold.

    `parse` turns a file's bytes into its tree (a caller holding trees of its own passes its
    cache; the trees are only read here, never changed).
    """

    def __init__(self, source: Source, parse: Callable[[bytes], ast.Module] = ast.parse) -> None:
        self.source = source
        self._parse = parse
        self._trees: dict[str, ast.Module | None] = {}
        self._names: dict[str, dict[str, ast.expr]] = {}
        self._imports: dict[str, dict[str, tuple[str, str]]] = {}

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            data = self.source(path)
            self._trees[path] = None if data is None else self._parse(data)
        return self._trees[path]

    def module_path(self, dotted: str) -> str | None:
        """`sglang.srt.arg_groups.choices` → its file in the release, or None."""
        base = dotted.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if self.tree(path) is not None:
                return path
        return None

    def value(self, node: ast.expr, path: str, local: Mapping[str, object] | None = None) -> object:
        """What `node` (in the module at `path`) evaluates to, or UNKNOWN."""
        return _Evaluator(self, path, local or {}, _HOPS).eval(node)

    def name(self, name: str, path: str, hops: int = _HOPS) -> object:
        """The value of module-level `name` in the module at `path`, or UNKNOWN."""
        self._index(path)
        if name in self._names[path]:
            return _Evaluator(self, path, {}, hops).eval(self._names[path][name])
        origin = self._imports[path].get(name)
        if origin is None or hops <= 0:
            return UNKNOWN
        module = self.module_path(origin[0])
        if module is None:
            return UNKNOWN
        return self.name(origin[1], module, hops - 1)

    def _index(self, path: str) -> None:
        if path in self._names:
            return
        names: dict[str, ast.expr] = {}
        imports: dict[str, tuple[str, str]] = {}
        tree = self.tree(path)
        package = path.rsplit("/", 1)[0].replace("/", ".")
        for node in tree.body if tree else []:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    names[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if isinstance(node.target, ast.Name):
                    names[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: from the package holding `path`
                    parts = package.split(".")
                    module = ".".join([*parts[: len(parts) - node.level + 1], module]).strip(".")
                for alias in node.names:
                    imports[alias.asname or alias.name] = (module, alias.name)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                _extended(names, node.value)
        self._names[path] = names
        self._imports[path] = imports


def _extended(names: dict[str, ast.expr], call: ast.Call) -> None:
    """`CHOICES.extend([...])` / `.append(x)` at module level: what the name holds once the
    module is imported (a plugin's `add_*_choices` call at run time is not seen)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in ("extend", "append") and call.args):
        return
    owner = func.value
    if isinstance(owner, ast.Name) and owner.id in names:
        added = call.args[0] if func.attr == "extend" else ast.List([call.args[0]], ast.Load())
        names[owner.id] = ast.BinOp(names[owner.id], ast.Add(), added)


class _Evaluator:
    def __init__(self, modules: Modules, path: str, local: Mapping[str, object], hops: int):
        self.modules, self.path, self.local, self.hops = modules, path, local, hops

    def eval(self, node: ast.expr) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list[object] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):  # [*QUANTIZATION_CHOICES, "unquant"]
                    inner = self.eval(element.value)
                    if not isinstance(inner, (list, tuple)):
                        return UNKNOWN
                    items += inner
                else:
                    items.append(self.eval(element))
            if any(i is UNKNOWN for i in items):
                return UNKNOWN
            return tuple(items) if isinstance(node, ast.Tuple) else list(items)
        if isinstance(node, ast.Dict):
            keys = [self.eval(k) if k is not None else UNKNOWN for k in node.keys]
            values = [self.eval(v) for v in node.values]
            if any(v is UNKNOWN for v in (*keys, *values)):
                return UNKNOWN
            try:
                return dict(zip(keys, values, strict=True))
            except TypeError:  # an unhashable key
                return UNKNOWN
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            operand = self.eval(node.operand)
            return -operand if isinstance(operand, (int, float)) else UNKNOWN
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Name):
            if node.id in self.local:
                return self.local[node.id]
            return self.modules.name(node.id, self.path, self.hops)
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "argparse.SUPPRESS":
            return argparse.SUPPRESS
        if isinstance(node, ast.Subscript):
            seq, index = self.eval(node.value), self.eval(node.slice)
            if (
                isinstance(seq, (list, tuple))
                and isinstance(index, int)
                and -len(seq) <= index < len(seq)
            ):
                return seq[index]
            return UNKNOWN
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("list", "tuple", "set", "sorted")
            and len(node.args) == 1
            and not node.keywords
        ):
            inner = self.eval(node.args[0])
            if isinstance(inner, (list, tuple, set, dict)):
                items = list(inner)
                return sorted(items) if node.func.id == "sorted" else items  # type: ignore[type-var]
        return UNKNOWN

    def _binop(self, node: ast.BinOp) -> object:
        left, right = self.eval(node.left), self.eval(node.right)
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        try:
            if isinstance(node.op, ast.Add):
                if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                    return [*left, *right]
                if isinstance(left, (int, float, str)) and type(left) is type(right):
                    return left + right  # type: ignore[operator]
            if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
                return left * right
        except TypeError:
            return UNKNOWN
        return UNKNOWN
