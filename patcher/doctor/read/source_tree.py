"""Reading an SGLang tree's source without importing it: files, ASTs, walks over chosen lines."""

from __future__ import annotations

import ast
import bisect
import os
import re
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from sglpatch.reading import files_under, read_regular

# No SGLang module comes near this (the largest, in 0.5.23, is 280 KB): a larger `.py` is not
# read, and is listed as not judged.
FILE_LIMIT = 4 << 20


_NO_SOURCE = frozenset({"__pycache__"})


class Source:
    """The `sglang` package on disk, and the files of it that could not be judged.

    Every read goes through `read`: regular files only, never waiting, at most `FILE_LIMIT`
    bytes. A file that exists but cannot be read, or that doctor cannot parse, is noted in
    `not_judged` (shown path -> why) and reported, never skipped in silence; so is a folder
    that exists but cannot be listed (shown with a trailing `/`): the files in it are unknown.
    """

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self.not_judged: dict[str, str] = {}

    def shown(self, path: Path) -> str:
        return f"sglang/{path.relative_to(self.package_dir).as_posix()}"

    def read(self, path: Path) -> bytes | None:
        """The file's bytes; None when it is missing, or (noted) cannot be read."""
        data, why = read_file(path)
        if why is not None:
            self.note(self.shown(path), why)
        return data

    def text(self, path: Path) -> str:
        data = self.read(path)
        return "" if data is None else data.decode("utf-8", errors="replace")

    def note(self, shown: str, why: str) -> None:
        self.not_judged.setdefault(shown, why)

    def note_folder(self, folder: str | Path, error: OSError) -> None:
        """A folder that exists but cannot be listed (`os.scandir` raised `error`)."""
        relative = Path(folder).relative_to(self.package_dir).as_posix()
        shown = "sglang/" if relative == "." else f"sglang/{relative}/"
        self.note(shown, unlisted(error))

    def python_files(self, folder: Path, *, deep: bool = False) -> list[Path]:
        """The `.py` files in `folder` (`deep`: and in its subfolders, links to folders not
        followed, as `Path.rglob`), sorted. `Path.glob` skips a folder it cannot list in
        silence; here it is noted (`note_folder`). A missing folder holds none. `__pycache__`
        holds no source (and may be a root-only folder): it is not looked into."""
        found, unlisted = files_under(folder, ".py", deep=deep, skip=_NO_SOURCE)
        for where, error in unlisted:
            self.note_folder(where, error)
        return found

    @staticmethod
    def is_file(path: Path) -> bool:
        """`path.is_file()`, False where this user may not look into its folder (Python 3.11's
        `Path.is_file` raises there): listing that folder notes it (`python_files`, the scan)."""
        return os.path.isfile(path)  # noqa: PTH113 - it answers False, Path.is_file raises

    def module_file(self, dotted: str) -> Path | None:
        if dotted != "sglang" and not dotted.startswith("sglang."):
            return None
        base = self.package_dir.joinpath(*dotted.split(".")[1:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            try:
                if candidate.is_file():
                    return candidate
            except OSError:  # a name too long for the file system: no such module
                continue
        return None

    def dotted(self, path: Path) -> str:
        parts = path.relative_to(self.package_dir).with_suffix("").parts
        parts = parts[:-1] if parts and parts[-1] == "__init__" else parts
        return ".".join(("sglang", *parts))


def read_file(path: str | Path) -> tuple[bytes | None, str | None]:
    """(bytes, None); (None, None) for a missing file; (None, why) for one that cannot be read:
    not a regular file, larger than `FILE_LIMIT`, or an error reading it."""
    try:
        return read_regular(path, FILE_LIMIT), None
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as error:
        return None, f"cannot be read: {error.strerror or error}"


def unlisted(error: OSError) -> str:
    """Why a folder is not judged."""
    return f"cannot be listed: {error.strerror or error} (the files in it are not judged)"


# Parsing a statement nested too deeply, or an expression of thousands of terms, exhausts the
# parser (RecursionError, MemoryError); so may walking its tree. The file is then not judged.
TOO_DEEP = (RecursionError, MemoryError)
TOO_DEEP_WHY = "cannot be parsed: nested too deeply or too long an expression"


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


def from_imports(text: str, module: str) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Each `from a import b as c` of a module's text: (absolute module, [(name, local name)]),
    read from its lines, not parsed: an import is a statement of its own, on lines of its own."""
    for match in _from_import_lines(text):
        level = len(match.group(1)) - len(match.group(1).lstrip("."))
        node = ast.ImportFrom(module=match.group(1).lstrip(".") or None, names=[], level=level)
        base = absolute_module(node, module)
        if not base:
            continue
        names = []
        for item in match.group(2).strip("()").replace("\n", " ").split(","):
            parts = item.split("#")[0].split()
            if len(parts) == 1 and parts[0].isidentifier():
                names.append((parts[0], parts[0]))
            elif len(parts) == 3 and parts[1] == "as" and parts[0].isidentifier():
                names.append((parts[0], parts[2]))
        yield base, names


def imported_modules(text: str, module: str) -> Iterator[str]:
    """The modules a module's text imports (`from a import b`: `a` and `a.b`; `import a`)."""
    for base, names in from_imports(text, module):
        yield base
        yield from (f"{base}.{name}" for name, _ in names)
    for match in _IMPORT.finditer(text):
        for item in match.group(1).split("#")[0].split(","):
            if parts := item.split():
                yield parts[0]


_FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.MULTILINE
)
# Where a `from ... import` starts: led by a literal, which the regex engine skips ahead to (a
# pattern led by `^` is tried at every offset, several times slower over the models modules).
_FROM_WORD = re.compile(r"from[ \t]+[.\w]+[ \t]+import[ \t]")


def _from_import_lines(text: str) -> Iterator[re.Match[str]]:
    """`_FROM_IMPORT.finditer(text)`, each match tried only where a line holds `from ... import`
    after its indentation alone."""
    position = 0
    while (hit := _FROM_WORD.search(text, position)) is not None:
        start = text.rfind("\n", 0, hit.start()) + 1
        if start >= position and not text[start : hit.start()].strip(" \t"):
            match = _FROM_IMPORT.match(text, start)
            if match is not None:
                yield match
                position = match.end()
                continue
        position = hit.start() + 1


_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]*)", re.MULTILINE)


def chain(node: ast.expr) -> list[str]:
    """`self.target_worker.model_runner.model` -> ["self", "target_worker", ...]."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def last_name(node: ast.expr) -> str:
    """`self.server_args.decode_backend` -> "decode_backend"; "" for what names nothing."""
    names = chain(node)
    return names[-1] if names else ""


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
        for child in reversed(_children(node)):
            start = getattr(child, "lineno", None)
            if start is not None:
                index = bisect.bisect_left(lines, start)
                end = getattr(child, "end_lineno", None) or start
                if index == len(lines) or lines[index] > end:
                    continue
            stack.append((child, depth + 1))


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` (breadth first), without operators and contexts, which hold nothing: the
    same nodes in the same order, a generator cheaper (`_children`)."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        todo.extend(_children(node))
        yield node


def every_node(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `tree` as `ast.walk` gives them, in another order and without operators and
    contexts (which hold nothing): `ast.walk` costs two generators per node."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_children(node))


def _children(node: ast.AST) -> list[ast.AST]:
    """The nodes right under `node`, in its fields' order, operators and contexts left out."""
    fields = _CHILD_FIELDS.get(node.__class__)
    if fields is None:
        fields = _CHILD_FIELDS[node.__class__] = tuple(
            f for f in node._fields if f not in _NO_CHILDREN
        )
    children: list[ast.AST] = []
    for field in fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            children.extend(
                item for item in value if isinstance(item, ast.AST) and not isinstance(item, _EMPTY)
            )
        elif isinstance(value, ast.AST) and not isinstance(value, _EMPTY):
            children.append(value)
    return children


_EMPTY = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
# Fields that never hold a node but an operator or context (`_EMPTY`), a name, a string or a
# number, in every node class that has them (not `name`: Python 3.12's `TypeAlias.name` is a
# node).
_NO_CHILDREN = frozenset(
    {"ctx", "op", "ops", "id", "attr", "arg", "asname", "module", "level", "kind"}
    | {"conversion", "simple", "is_async", "type_comment", "tag", "rest", "kwd_attrs"}
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
