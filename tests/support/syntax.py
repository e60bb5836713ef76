"""Python syntax trees (`ast`) of wheel sources, parsed once per test process and only read.

The stand-ins cut SGLang's selection code out of a release's source with `ast`, and the tests
ask for the same files again and again: the matrix builds 0.5.22's tilelang kernel 50 times,
each from its source, and every patch test compiles its release's capability predicates from
`common.py`. Those repeated parses were a fifth of the suite's CPU (py-spy, 2026-12-02).

A tree from `tree` is shared, so its readers follow one rule: put its nodes into new nodes
(`compile` leaves them as they are), never assign to a field of one (`copy.copy` it first).
`unchanged` proves the rule held: a tree dropped from the cache, and every tree still held at the
end of the session (conftest), must dump as it did when it was parsed (`ast.dump`: every field,
not the line numbers, which cost as much again and which no reader sets).
"""

from __future__ import annotations

import ast
from collections.abc import Hashable
from typing import Any

from tests.support import parsing

# Bytes of source whose trees are kept (a tree takes some 23 times its source): a release's
# server_args.py is up to 300 kB, common.py about 150 kB.
BUDGET = 8_000_000


class SharedTrees(parsing.SharedParses):
    """`ast.parse`, with the trees of the most recently used sources kept, each with the
    fingerprint it had when parsed."""

    def __init__(self, budget: int = BUDGET) -> None:
        super().__init__(_fingerprinted, budget)

    def __call__(self, source: str | bytes) -> ast.Module:
        tree: ast.Module = self._shared(source, source, (source,))[0]
        return tree

    def _dropped(self, key: Hashable, result: Any) -> None:
        _check(key, *result)

    def unchanged(self) -> None:
        """Every tree held still reads as parsed (AssertionError names one that does not)."""
        for source, (result, _) in self._kept.items():
            _check(source, *result)


def _fingerprinted(source: str | bytes) -> tuple[ast.Module, int]:
    tree = ast.parse(source)
    return tree, _fingerprint(tree)


def _fingerprint(tree: ast.Module) -> int:
    return hash(ast.dump(tree))


def _check(source: Hashable, tree: ast.Module, fingerprint: int) -> None:
    if _fingerprint(tree) == fingerprint:
        return
    text = source.decode(errors="replace") if isinstance(source, bytes) else str(source)
    first = text.strip().splitlines()[0] if text.strip() else ""
    raise AssertionError(
        f"a test changed a shared syntax tree (of the source starting {first[:80]!r}): copy a "
        "node before assigning to its fields (tests/support/syntax.py)"
    )


tree = SharedTrees()
