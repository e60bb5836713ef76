"""What `gates` reads off one decision's syntax: the shape of its tests (a range, a family
helper, a truth value), the `if`s around it, the flag it sets and whether a branch leaves it on.

Plain functions of the tree and an `Evaluator`; `gates.Gates` holds the per-module state.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import NamedTuple

from sglpatch.doctor.facts import sglang
from sglpatch.doctor.gates import branches as branches_of
from sglpatch.doctor.gates import devices
from sglpatch.doctor.gates.evaluator import Evaluator
from sglpatch.doctor.read.source_tree import walk

KNOWN = frozenset({9, 10})
NEW = devices.NEW
Function = ast.FunctionDef | ast.AsyncFunctionDef


class Decision(NamedTuple):
    """One decision: its tests, and what each branch does and holds."""

    tests: list[ast.expr]
    branches: list[str | None]  # what each branch does first (None: goes on past it)
    bodies: list[Sequence[ast.AST]]  # each branch's statements, or its expression
    top_level: bool  # a statement of a function's own body
    field: str | None = None  # the flag an expression's branches are assigned to
    boolean: bool = False  # a truth value assigned or returned


def conditions_to(node: ast.AST, ancestors: Sequence[ast.AST]) -> list[tuple[ast.expr, bool]]:
    """The tests of the `if`s around `node`, each with the truth it needs to get there."""
    found: list[tuple[ast.expr, bool]] = []
    inner: ast.AST = node
    for outer in reversed(ancestors):
        if isinstance(outer, ast.If):
            if any(inner is s for s in outer.body):
                found.append((outer.test, True))
            elif any(inner is s for s in outer.orelse):
                found.append((outer.test, False))
        inner = outer
    return found


def reaches(
    evaluator: Evaluator, node: ast.AST, ancestors: Sequence[ast.AST], device: devices.Device
) -> bool:
    """Whether `device` can get to `node`: no `if` around it needs a truth its test cannot have
    there (the `else` after an `elif major == 12:` arm, on 12)."""
    return all(
        branches_of.tri(evaluator, test, device) is not (not needed)
        for test, needed in conditions_to(node, ancestors)
    )


def flag_of(node: ast.AST, function: Function | None, decision: Decision) -> str | None:
    """The kernel flag (`sglang.FLAGS`) this decision sets: its assigned name, or the flag
    function it sits in."""
    if decision.boolean and isinstance(node, ast.Assign):
        for name in assigned(node):
            if name in sglang.FLAGS:
                return name
    if function is not None and function.name in sglang.FLAGS:
        return function.name
    return None


def turns_on(
    decision: Decision,
    index: int,
    evaluator: Evaluator,
    device: devices.Device,
    node: ast.AST,
    function: Function | None,
) -> bool:
    """Whether branch `index` leaves the flag on: `True` of a truth value; in a flag function,
    a branch that does not return false (or raise) goes on to turn it on, unless a later
    statement of the function's own body returns false on `device` (an early return)."""
    if decision.boolean:
        return index == 0
    if refuses(decision.bodies[index]):
        return False
    if function is None or not decision.top_level:
        return True
    end = getattr(node, "end_lineno", 0) or 0
    for statement in function.body:
        if statement.lineno <= end:
            continue
        if isinstance(statement, ast.Return):
            return True
        if (
            isinstance(statement, ast.If)
            and refuses(statement.body)
            and branches_of.tri(evaluator, statement.test, device) is True
        ):
            return False
    return True


def refuses(body: Sequence[ast.AST]) -> bool:
    """The statements end by raising or returning false."""
    last = body[-1] if body else None
    if isinstance(last, ast.Raise):
        return True
    return isinstance(last, ast.Return) and (
        last.value is None or (isinstance(last.value, ast.Constant) and not last.value.value)
    )


def device_line(test: ast.expr, evaluator: Evaluator) -> int:
    """The line of a multi-line test where the device comes in."""
    for part in walk(test):
        if isinstance(
            part, (ast.Compare, ast.Call, ast.Name, ast.Attribute)
        ) and evaluator.depends_on_device(part):
            return part.lineno
    return test.lineno


def describe(branch: str | None, node: ast.AST) -> str:
    if branch is not None:
        return branch
    return "skips the block" if isinstance(node, (ast.If, ast.While)) else "passes"


def open_ended(test: ast.expr, evaluator: Evaluator) -> bool:
    """A range (`>= 90`, `< (10, 0)`) or a family helper (`is_blackwell()`) in the test."""
    for part in walk(test):
        if isinstance(part, ast.Compare) and any(
            isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in part.ops
        ):
            if any(evaluator.is_quantity(side) for side in (part.left, *part.comparators)):
                return True
        elif isinstance(part, ast.Call) and isinstance(part.func, ast.Name):
            majors = devices.helper_majors(part.func.id, evaluator.helpers)
            if majors and NEW in majors and majors & KNOWN:
                return True
        elif (probe := evaluator.probe(part)) is not None:
            majors = evaluator.helpers.get(sglang.PROBE + probe)
            if majors and NEW in majors and majors & KNOWN:
                return True
        elif isinstance(part, ast.Name) and part.id in evaluator.module_aliases:
            for value, _ in evaluator.module_aliases[part.id]:
                if value is not test and open_ended(value, evaluator):
                    return True
    return False


def is_boolean(value: ast.expr) -> bool:
    if isinstance(value, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.args


def spans(tests: Sequence[ast.expr], lines: Sequence[int]) -> bool:
    wanted = set(lines)
    return any(
        any(line in wanted for line in range(t.lineno, (t.end_lineno or t.lineno) + 1))
        for t in tests
    )


def enclosing(ancestors: Sequence[ast.AST]) -> Function | None:
    for node in reversed(ancestors):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def assigned(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def expression_text(node: ast.expr) -> str:
    try:
        return ast.unparse(node)
    except (ValueError, AttributeError, RecursionError):
        return ""
