"""The tests' shared parses, cuts and syntax trees (`tests/support/parsing.py`, `syntax.py`)
answer as the functions they stand for, and the rule that keeps a shared tree safe is checked."""

from __future__ import annotations

import ast
import copy

import pytest

from sglpatch import elision, engine
from tests.support import parsing, syntax

SOURCE = b"import os\n\n\ndef kept():\n    return 1\n\n\ndef left_out():\n    return 2\n"


def test_a_tree_is_shared_and_a_changed_one_is_caught() -> None:
    trees = syntax.SharedTrees()
    tree = trees(SOURCE)
    assert trees(SOURCE) is tree
    assert ast.dump(tree) == ast.dump(ast.parse(SOURCE))
    bare = copy.copy(tree.body[1])  # the rule: copy, then assign
    assert isinstance(bare, ast.FunctionDef)
    bare.name = "renamed"
    trees.unchanged()
    function = tree.body[1]
    assert isinstance(function, ast.FunctionDef)
    function.name = "renamed"
    with pytest.raises(AssertionError, match="changed a shared syntax tree"):
        trees.unchanged()


def test_a_tree_changed_before_it_is_dropped_is_caught() -> None:
    trees = syntax.SharedTrees(budget=len(SOURCE))
    function = trees(SOURCE).body[1]
    assert isinstance(function, ast.FunctionDef)
    function.decorator_list.append(ast.Name("staticmethod", ast.Load()))
    with pytest.raises(AssertionError, match="import os"):
        trees(SOURCE.replace(b"os", b"re"))  # over the budget: the first is dropped, and checked


def test_the_session_shares_parses_and_cuts_that_equal_their_own() -> None:
    assert isinstance(engine.parse, parsing.SharedParses)
    assert isinstance(elision.elide, parsing.SharedCuts)
    cut = elision.elide(SOURCE, {"kept"})
    assert cut is not None and b"left_out" not in cut.text
    assert elision.elide(SOURCE, ["kept"]) is cut  # the names as a set: any collection
    assert elision.elide(SOURCE, {"left_out"}) != cut
    with parsing.afresh():
        fresh = elision.elide(SOURCE, {"kept"})
        assert fresh == cut and fresh is not cut
        assert engine.parse(SOURCE) is not engine.parse(SOURCE)
    assert engine.parse(SOURCE) is engine.parse(SOURCE)


def test_a_cut_is_kept_within_its_budget() -> None:
    calls: list[bytes] = []

    def elide(source: bytes, reads: object) -> bytes:
        calls.append(source)
        return source

    cuts = parsing.SharedCuts(elide, budget=2 * len(SOURCE))
    for source in (SOURCE, SOURCE, SOURCE + b"#", SOURCE + b"##", SOURCE):
        cuts(source, {"kept"})
    assert calls == [SOURCE, SOURCE + b"#", SOURCE + b"##", SOURCE]  # the oldest was dropped
