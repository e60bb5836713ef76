"""Capability gaps: code that treats CUDA compute-capability majors and leaves 12 out.

Tables keyed by majors that know 9 and/or 10 but not 12 (kind `table`, unless the table is only
ever read with `.get(major, default)`), and equality gates on a capability such as `== 10`,
`!= 9` or `in (9, 10)` (kind `gate`); a `>= 9` gate admits 12 and is not a gap.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from sglpatch.source_tree import Source, chain, parallel, walk_with_ancestors

MAJORS = frozenset(range(7, 14))  # plausible compute-capability majors
KNOWN = frozenset({9, 10})
NEW = 12


# A file is parsed only if its bytes could hold a gap: a dict row keyed 9 or 10 (after a
# brace, a comma or a line start), or a capability-like name compared with 9 or 10.
_ROW = re.compile(rb"(?:^|[{,])\s*(?:9|10)\s*:", re.MULTILINE)
_GATE = re.compile(
    rb"(?:apabilit\w*(?:\(\))?(?:\[0\])?|major)\s*"
    rb"(?:[=!]=\s*\(?\s*(?:9|10)\b|(?:not\s+)?in\s*[\[({][^\])}]{0,80}?\b(?:9|10)\b)",
    re.IGNORECASE,
)


def find(source: Source) -> list[tuple[str, int, str, str]]:
    paths = sorted(source.package_dir.rglob("*.py"))
    found = parallel(_scan_file, paths, source)
    return [
        (source.shown(path), line, kind, code) for path, gaps in found for line, kind, code in gaps
    ]


def _scan_file(args: tuple[Path, str]) -> tuple[Path, list[tuple[int, str, str]]]:
    path = args[0]
    try:
        data = path.read_bytes()
    except OSError:
        return path, []
    if not _may_hold_gaps(data):
        return path, []
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError):
        return path, []
    candidates = sorted(
        {data.count(b"\n", 0, m.start()) + 1 for p in (_ROW, _GATE) for m in p.finditer(data)}
    )
    lines = data.decode("utf-8", errors="replace").splitlines()
    return path, [
        (line, kind, lines[line - 1].strip() if line <= len(lines) else "")
        for line, kind in sorted(set(_gaps_in(tree, candidates)))
    ]


def _may_hold_gaps(data: bytes) -> bool:
    """Substring tests first: regular expressions over 60 MB of source cost seconds."""
    if (b"9:" in data or b"10:" in data) and _ROW.search(data):
        return True
    topical = b"apabilit" in data or b"APABILIT" in data or b"major" in data
    return topical and _GATE.search(data) is not None


def _gaps_in(tree: ast.Module, candidates: Sequence[int]) -> Iterator[tuple[int, str]]:
    tables: list[tuple[int, set[str]]] = []
    for node, _ in walk_with_ancestors(tree, candidates):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            keys = _int_keys(node.value)
            if keys and keys <= MAJORS and keys & KNOWN and NEW not in keys:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tables.append((node.lineno, {c[-1] for t in targets if (c := chain(t))}))
        elif isinstance(node, ast.Compare) and _is_gate(node):
            yield node.lineno, "gate"
    if not tables:
        return
    # A table only ever read with `.get(key, default)` takes an unknown major in its stride.
    tolerant = _tolerant_names(tree)
    for line, names in tables:
        if not names & tolerant:
            yield line, "table"


def _tolerant_names(tree: ast.Module) -> set[str]:
    subscripted: set[str] = set()
    defaulted: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if names := chain(node.value):
                subscripted.add(names[-1])
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and len(node.args) == 2
                and (names := chain(func.value))
            ):
                defaulted.add(names[-1])
    return defaulted - subscripted


def _int_keys(node: ast.Dict) -> set[int] | None:
    keys = set()
    for key in node.keys:
        if not (isinstance(key, ast.Constant) and type(key.value) is int):
            return None
        keys.add(key.value)
    return keys


def _is_gate(node: ast.Compare) -> bool:
    if len(node.ops) != 1:
        return False
    left, op, right = node.left, node.ops[0], node.comparators[0]
    if not _is_capability(left):
        left, right = right, left
        if not _is_capability(left):
            return False
    if isinstance(op, (ast.Eq, ast.NotEq)):
        return bool(_majors(right, single=True) & KNOWN)
    if isinstance(op, (ast.In, ast.NotIn)):
        values = _majors(right, single=False)
        return bool(values & KNOWN) and NEW not in values
    return False


def _is_capability(node: ast.expr) -> bool:
    """`compute_capability`, `get_device_capability()[0]`, `self.device_capability`, `major`."""
    while isinstance(node, (ast.Subscript, ast.Call)):
        if isinstance(node, ast.Subscript):
            index = node.slice
            if isinstance(index, ast.Constant) and index.value != 0:
                return False  # [1] is the minor version
            node = node.value
        else:
            node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    name = name.lower()
    return "capabilit" in name or name in {"major", "cc_major", "sm_major", "device_major"}


def _majors(node: ast.expr, single: bool) -> set[int]:
    """The majors a literal names: `10`, `(9, 0)` for ==, or `(9, 10)`, `[10, 11]` for in."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {node.value} & MAJORS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        ints = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
        if single:  # (major, minor)
            return {ints[0]} & MAJORS if len(ints) == 2 == len(node.elts) else set()
        return set(ints) & MAJORS
    return set()
