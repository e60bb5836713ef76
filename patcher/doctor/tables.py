"""Tables keyed by compute-capability majors that know 10 but not 12.

A table without a row for 10 fails on 10 as it does on 12: no gap of 12's own, so not reported.

A table read with a subscript gives capability 12 a `KeyError: 12`; one only ever read with
`.get(major, default)` takes an unknown major in its stride and is not reported.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import chain

MAJORS = frozenset(range(7, 14))  # plausible compute-capability majors
KNOWN = 10
NEW = 12


def tables(tree: ast.Module, shown: str, lines: Sequence[str]) -> list[Finding]:
    tables: list[tuple[int, set[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            keys = _int_keys(node.value)
            if keys and keys <= MAJORS and KNOWN in keys and NEW not in keys:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tables.append((node.lineno, {c[-1] for t in targets if (c := chain(t))}))
    if not tables:
        return []
    # A table only ever read with `.get(key, default)` takes an unknown major in its stride.
    subscripted, tolerant = _reads(tree)
    found = []
    for line, names in tables:
        if names & subscripted:
            code = lines[line - 1].strip() if line <= len(lines) else ""
            found.append(Finding(shown, line, "table", code, "KeyError: 12", "its row"))
        elif not names & tolerant:
            code = lines[line - 1].strip() if line <= len(lines) else ""
            found.append(Finding(shown, line, "table", code, "no row", "its row"))
    return found


def _reads(tree: ast.Module) -> tuple[set[str], set[str]]:
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
    return subscripted, defaulted - subscripted


def _int_keys(node: ast.Dict) -> set[int] | None:
    keys = set()
    for key in node.keys:
        if not (isinstance(key, ast.Constant) and type(key.value) is int):
            return None
        keys.add(key.value)
    return keys
