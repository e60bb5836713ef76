"""Where the kernel packages sit in site-packages, which versions they are, and which file
each loads: all from metadata and source text, never by importing them."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

from sglpatch.reading import read_regular

_MAX_TEXT = 4 << 20  # a METADATA, RECORD or loader larger than this is not one


def normalize(name: str) -> str:
    """PEP 503 name normalization, as dist-info folder names use it (with `_`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def read_text(path: Path) -> str | None:
    """A small regular text file's contents, or None (missing, not a regular file, too large).

    Never opened before it is known to be a regular file, nor waited on if a FIFO is swapped
    in after that (`read_regular`).
    """
    try:
        return read_regular(path, _MAX_TEXT).decode("utf-8", errors="replace")
    except OSError:
        return None


class Distributions:
    """The dist-info folders of one site-packages, read lazily and once."""

    def __init__(self, site_packages: Path) -> None:
        self.root = site_packages
        self._by_name: dict[str, Path] = {}
        try:
            entries = list(site_packages.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            if entry.name.endswith(".dist-info") and entry.is_dir():
                name = entry.name[: -len(".dist-info")].rpartition("-")[0] or entry.name
                self._by_name.setdefault(normalize(name), entry)

    def version(self, name: str) -> str | None:
        """The `Version:` of distribution `name`, or None when it is not installed."""
        folder = self._by_name.get(normalize(name))
        text = read_text(folder / "METADATA") if folder else None
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.partition(":")[2].strip()
            if not line.strip():
                break
        return None

    def owns(self, name: str, relpath: str) -> bool:
        """Whether distribution `name`'s RECORD lists `relpath` (who shipped a bundled copy)."""
        folder = self._by_name.get(normalize(name))
        text = read_text(folder / "RECORD") if folder else None
        return text is not None and any(
            line.split(",", 1)[0] == relpath for line in text.splitlines()
        )


def literals(path: Path, *names: str) -> dict[str, str | None]:
    """Module-level `name = "literal"` (or `name: T = ...`) assignments of a source file."""
    text = read_text(path)
    found: dict[str, str | None] = {}
    if text is None:
        return found
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return found
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and target.id in names
            and isinstance(value, ast.Constant)
            and (value.value is None or isinstance(value.value, str))
        ):
            found[target.id] = value.value
    return found


class Loader(NamedTuple):
    """Which common_ops build sgl-kernel loads on one capability, and from where it knows."""

    subdir: str | None  # "sm100", "" for sgl_kernel/ itself, None when it cannot be told
    how: str


def sgl_kernel_build(package: Path, capability: tuple[int, int]) -> Loader:
    """Evaluate sgl-kernel's own loader for `capability` (major*10+minor, as it computes it).

    From 0.3.17 or so `load_utils._load_architecture_specific_ops` picks `sm90/` or `sm100/`
    with an if/elif chain on `compute_capability`; earlier releases import `common_ops` from
    the package folder. Only that chain's shape is trusted: anything else is "cannot tell".
    """
    loader = package / "load_utils.py"
    text = read_text(loader)
    if text is None:
        if any(package.glob("common_ops.*")):
            return Loader("", "sgl_kernel/common_ops (no architecture-specific loader)")
        return Loader(None, "no load_utils.py and no common_ops library")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return Loader(None, "load_utils.py does not parse")
    value = capability[0] * 10 + capability[1]
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _assigns_subdir(node):
            chosen = _walk_chain(node, value)
            if chosen is not None:
                return Loader(chosen, f"load_utils.py picks {chosen}/ for capability {value}")
            return Loader(None, "load_utils.py's choice of build cannot be evaluated")
    return Loader(None, "load_utils.py has no `ops_subdir = ...` choice")


def _assigns_subdir(node: ast.If) -> bool:
    return any(
        isinstance(s, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "ops_subdir" for t in s.targets)
        for s in node.body
    )


def _walk_chain(node: ast.If, value: int) -> str | None:
    current: ast.stmt | None = node
    while isinstance(current, ast.If):
        verdict = _test(current.test, value)
        if verdict is None:
            return None
        if verdict:
            return _subdir_in(current.body)
        orelse = current.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If):
            current = orelse[0]
            continue
        return _subdir_in(orelse)
    return None


def _subdir_in(body: list[ast.stmt]) -> str | None:
    for s in body:
        if (
            isinstance(s, ast.Assign)
            and isinstance(s.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == "ops_subdir" for t in s.targets)
        ):
            return str(s.value.value)
    return None


def _test(test: ast.expr, value: int) -> bool | None:
    """`compute_capability == 90`, `>= 100`, `is not None`, `in (...)`, and/or of those."""
    if isinstance(test, ast.BoolOp):
        parts = [_test(v, value) for v in test.values]
        if None in parts:
            return None
        return all(parts) if isinstance(test.op, ast.And) else any(parts)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if not (isinstance(left, ast.Name) and left.id == "compute_capability"):
        return None
    if isinstance(right, ast.Constant) and right.value is None:
        # A capability is being judged, so the loader's "no GPU" branch is never taken.
        if isinstance(op, (ast.Is, ast.IsNot)):
            return isinstance(op, ast.IsNot)
        return None
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        items = [e.value for e in right.elts if isinstance(e, ast.Constant)]
        return (value in items) == isinstance(op, ast.In)
    if not (isinstance(right, ast.Constant) and isinstance(right.value, int)):
        return None
    other = right.value
    table = {
        ast.Eq: value == other,
        ast.NotEq: value != other,
        ast.Lt: value < other,
        ast.LtE: value <= other,
        ast.Gt: value > other,
        ast.GtE: value >= other,
    }
    return table.get(type(op))
