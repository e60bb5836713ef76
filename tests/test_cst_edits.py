"""`cst_tools.replace` and `ifs_testing` find statements through blocks alone: at every depth a
statement can sit (functions, classes, `elif`, `else`, handlers, `finally`, `with`, `match`),
with the same result as a search of every node."""

from __future__ import annotations

import libcst as cst
import pytest

from sglpatch import cst_tools

SOURCE = """\
import os

def f(x):
    if x == 1:
        a = 1
    elif x == 2:
        b = 2
    else:
        for i in range(3):
            pass
        else:
            c = 3
    try:
        d = 4
    except ValueError:
        e = 5
    finally:
        g = 6
    with open(x) as h:
        if h:
            k = 7
    match x:
        case 8:
            m = 8
    y = [v for v in x if v]

class C:
    n = 9
    def method(self):
        if self.n == 9:
            return lambda q: 1 if q else 2
"""

# Each statement to replace, by the source text of its first line.
TARGETS = ["a = 1", "b = 2", "c = 3", "d = 4", "e = 5", "g = 6", "k = 7", "m = 8", "n = 9"]


def _statement(module: cst.Module, text: str) -> cst.SimpleStatementLine:
    found = [
        s
        for s in cst_tools.walk(module, cst.SimpleStatementLine)
        if module.code_for_node(s).strip() == text
    ]
    assert len(found) == 1, text
    return found[0]


@pytest.mark.parametrize("text", TARGETS)
def test_a_statement_is_replaced_where_it_sits(text: str) -> None:
    module = cst.parse_module(SOURCE)
    new = cst.parse_statement(text.replace("=", "= 10 +"))
    patched = cst_tools.replace(module, _statement(module, text), new)
    assert patched.code == SOURCE.replace(text, text.replace("=", "= 10 +"))
    assert cst_tools.replace_statement(module, _statement(module, text), new).code == patched.code


def test_an_elif_and_an_expression_are_replaced_too() -> None:
    module = cst.parse_module(SOURCE)
    chain = cst_tools.find_function(module, "f").body.body[0]
    assert isinstance(chain, cst.If) and isinstance(chain.orelse, cst.If)
    elif_ = chain.orelse
    patched = cst_tools.replace(
        module, elif_, elif_.with_changes(test=cst.parse_expression("x == 3"))
    )
    assert patched.code == SOURCE.replace("elif x == 2:", "elif x == 3:")
    assert isinstance(elif_.test, cst.Comparison)
    number = elif_.test.comparisons[0].comparator  # not a statement: every node is searched
    patched = cst_tools.replace(module, number, cst.Integer("20"))
    assert patched.code == SOURCE.replace("x == 2", "x == 20")


def test_a_node_from_another_tree_is_an_anchor_missing() -> None:
    module = cst.parse_module(SOURCE)
    other = _statement(cst.parse_module(SOURCE), "k = 7")
    with pytest.raises(cst_tools.AnchorMissing):
        cst_tools.replace(module, other, other)


def test_ifs_testing_finds_what_a_walk_of_every_node_finds_in_its_order() -> None:
    module = cst.parse_module(SOURCE)
    for scope in (module, cst_tools.find_function(module, "f"), cst_tools.find_class(module, "C")):
        for text in ("x", "h", "self.n", "q", ""):
            every = [
                i for i in cst_tools._walk(scope, cst.If) if text in module.code_for_node(i.test)
            ]
            assert cst_tools.ifs_testing(module, scope, text) == every
    assert len(cst_tools.ifs_testing(module, module, "")) == 4  # if, elif, `if h`, `if self.n`
