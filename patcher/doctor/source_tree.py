"""Reading an SGLang tree's source without importing it: files, ASTs, walks over chosen lines."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator, Sequence
from pathlib import Path


class Source:
    """The `sglang` package on disk: files read and parsed once each, on demand."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self._trees: dict[Path, ast.Module | None] = {}

    def shown(self, path: Path) -> str:
        return f"sglang/{path.relative_to(self.package_dir).as_posix()}"

    def text(self, path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tree(self, path: Path) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.text(path), filename=str(path))
            except (SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    def module_file(self, dotted: str) -> Path | None:
        if dotted != "sglang" and not dotted.startswith("sglang."):
            return None
        base = self.package_dir.joinpath(*dotted.split(".")[1:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def dotted(self, path: Path) -> str:
        parts = path.relative_to(self.package_dir).with_suffix("").parts
        parts = parts[:-1] if parts and parts[-1] == "__init__" else parts
        return ".".join(("sglang", *parts))


# A string literal on one line, quotes escaped inside it; a prefix (`f"..."`) stays outside.
_ONE_LINE_STRING = re.compile(r"'[^'\\\n]*(?:\\.[^'\\\n]*)*'" + r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"')


def without_strings(line: str) -> str:
    """A line of code with its one-line string literals emptied: words in them decide nothing."""
    return _ONE_LINE_STRING.sub("''", line) if "'" in line or '"' in line else line


def absolute_module(node: ast.ImportFrom, module: str) -> str | None:
    if not node.level:
        return node.module
    package = module.split(".")[: -node.level]
    return ".".join([*package, node.module] if node.module else package) or None


def imported_modules(text: str, module: str) -> Iterator[str]:
    """The modules a module's text imports (`from a import b`: `a` and `a.b`), read from its
    lines, not parsed: an import is a statement of its own, on lines of its own."""
    for match in _IMPORT.finditer(text):
        if match.group(1) is not None:
            level = len(match.group(1)) - len(match.group(1).lstrip("."))
            node = ast.ImportFrom(module=match.group(1).lstrip(".") or None, names=[], level=level)
            base = absolute_module(node, module)
            if not base:
                continue
            yield base
            for item in match.group(2).strip("()").replace("\\", " ").split(","):
                parts = item.split("#")[0].split()
                if parts and parts[0].isidentifier():
                    yield f"{base}.{parts[0]}"
        else:
            for item in match.group(3).split("#")[0].split(","):
                parts = item.split()
                if parts:
                    yield parts[0]


_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)|import[ \t]+([^\n]*))",
    re.MULTILINE,
)


def chain(node: ast.expr) -> list[str]:
    """`self.target_worker.model_runner.model` -> ["self", "target_worker", ...]."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def walk_with_ancestors(
    tree: ast.AST, lines: Sequence[int]
) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """Nodes spanning one of `lines`, each with its ancestors (one shared list), in pre-order.

    Subtrees that span none of the lines are skipped: walking every node of a large module
    in Python costs far more than parsing it. Operators and load/store contexts, which hold
    nothing, are not visited. An explicit stack: nested generators cost a frame per level.
    """
    ancestors: list[ast.AST] = []
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        del ancestors[depth:]
        yield node, ancestors
        ancestors.append(node)
        children: list[ast.AST] = []
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                children.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                children.append(value)
        for child in reversed(children):
            if isinstance(child, _EMPTY):
                continue
            start = getattr(child, "lineno", None)
            if start is not None:
                index = bisect.bisect_left(lines, start)
                end = getattr(child, "end_lineno", None) or start
                if index == len(lines) or lines[index] > end:
                    continue
            stack.append((child, depth + 1))


_EMPTY = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
