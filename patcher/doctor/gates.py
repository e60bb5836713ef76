"""One module's capability decisions: which branches a capability-12 GPU takes, and what they
choose.

Every decision that depends on the GPU (an `if`/`elif` chain, a conditional expression, an
`assert`, a boolean a function returns or a flag it sets) is evaluated in three values
(`branches`) for capability 8.0, 9.0, 10.0, 12.0 and 12.1 (see `devices`). A decision is a
finding when 12 takes a branch because of the GPU: its own capability test lets it in, or 8, 9
or 10 never get there. Its kind says how:

- `excludes`: 12 takes a branch 10 never takes (`is_sm100_supported()`, `== 10`, `in (9, 10)`);
- `shares`: a range or family test (`get_device_sm() >= 90`, `is_blackwell()`) sends 12 down
  the path of 9 or 10 that it keeps from 8, which may be an SM90/SM100-only path;
- `decides`: any other (`in (10, 12)`, an Ampere special case);
- `refusal`: every branch 12 takes raises (or an `assert` fails): listed apart;
- `table`: a dict keyed by majors that knows 9 or 10, not 12, is subscripted (`KeyError: 12`).

Each finding carries what 12.0, 12.1 and 10.0 choose there (backend flags, kernel entry
points: `entries`); `judged` looks those up in the kernel-support table. Code after a refusal at
the top of a function is not reached on 12.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from sglpatch.doctor import branches as branches_of
from sglpatch.doctor import devices, entries
from sglpatch.doctor.devices import AMPERE, B200, GB10, RTX_BLACKWELL
from sglpatch.doctor.evaluator import Evaluator
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import walk_with_ancestors

KNOWN = frozenset({9, 10})
NEW = devices.NEW
_DECISIONS = (
    ast.If, ast.IfExp, ast.Assert, ast.While, ast.Return, ast.Assign, ast.AnnAssign, ast.keyword
)  # fmt: skip
_Function = ast.FunctionDef | ast.AsyncFunctionDef


class Gates:
    """The decisions of one parsed module (or the functions parsed out of it) on given lines."""

    def __init__(
        self,
        tree: ast.Module,
        shown: str,
        lines: Sequence[str],
        helpers: Mapping[str, frozenset[int]],
        defined: frozenset[str],
    ) -> None:
        self.tree = tree
        self.shown = shown
        self.lines = lines
        self.helpers = helpers
        self.module_aliases = devices.aliases_in(tree.body, deep=False)
        self.defined = defined
        self.evaluators: dict[int, Evaluator] = {}
        self.seen: set[int] = set()
        self.dead: dict[int, bool] = {}
        self.wanted: Sequence[int] = ()
        self.refused_after: dict[int, int] = {}  # function -> line of a top-level refusal

    def evaluator(self, function: _Function | None) -> Evaluator:
        key = id(function)
        if key not in self.evaluators:
            local = (
                devices.aliases_in(
                    [
                        n
                        for n, _ in walk_with_ancestors(function, self.wanted)
                        if isinstance(n, ast.Assign)
                    ],
                    deep=False,
                )
                if function is not None
                else {}
            )
            self.evaluators[key] = Evaluator(self.helpers, self.module_aliases, local, self.defined)
        return self.evaluators[key]

    def run(self, lines: Sequence[int]) -> Iterator[Finding]:
        self.wanted = lines
        tested: set[str] = set()
        pending: list[tuple[Finding, set[str], _Function | None]] = []
        for node, ancestors in walk_with_ancestors(self.tree, lines):
            if id(node) in self.seen:
                continue
            if not isinstance(node, _DECISIONS):
                continue
            decision = self._decision(node, ancestors, lines)
            if decision is None:
                continue
            function = _enclosing(ancestors)
            if self._unreachable(node, ancestors, function):
                continue
            for test in decision.tests:
                tested |= {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            finding = self._judge(node, decision, ancestors, function)
            if finding is None:
                continue
            if finding.kind == "refusal" and decision.top_level and function is not None:
                self.refused_after.setdefault(id(function), finding.line)
            names = _assigned(node)
            pending.append((finding, names, function))
        for finding, names, function in pending:
            refused = self.refused_after.get(id(function)) if function is not None else None
            if refused is not None and finding.line > refused and finding.kind != "refusal":
                continue  # 12 never gets here: the function refused it above
            if names and names & tested:
                continue  # a flag tested in this file: reported where it is tested
            yield finding

    def _unreachable(
        self, node: ast.AST, ancestors: Sequence[ast.AST], function: _Function | None
    ) -> bool:
        """Inside `if _is_hip:` (or another branch an NVIDIA GPU never takes)."""
        evaluator = self.evaluator(function)
        inner: ast.AST = node
        for outer in reversed(ancestors):
            if isinstance(outer, ast.If) and any(inner is s for s in outer.body):
                key = id(outer)
                if key not in self.dead:
                    self.dead[key] = evaluator.unreachable(outer.test)
                if self.dead[key]:
                    return True
            inner = outer
        return False

    def _decision(
        self, node: ast.AST, ancestors: Sequence[ast.AST], lines: Sequence[int]
    ) -> _Decision | None:
        """The tests of a decision, what each branch does (None: goes on past it) and the
        statements (or the expression) of each branch."""
        parent = ancestors[-1] if ancestors else None
        top_level = isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef))
        tests: list[ast.expr] = []
        branches: list[str | None] = []
        bodies: list[Sequence[ast.AST]] = []
        if isinstance(node, ast.If):
            current: ast.If | None = node
            while current is not None:
                self.seen.add(id(current))
                tests.append(current.test)
                branches.append(self._first(current.body))
                bodies.append(current.body)
                orelse = current.orelse
                if len(orelse) == 1 and isinstance(orelse[0], ast.If):
                    current = orelse[0]
                else:
                    branches.append(self._first(orelse) if orelse else None)
                    bodies.append(orelse)
                    current = None
            found = _Decision(tests, branches, bodies, top_level)
            return found if _spans(tests, lines) else None
        if isinstance(node, ast.IfExp):
            expression: ast.expr = node
            while isinstance(expression, ast.IfExp):
                self.seen.add(id(expression))
                tests.append(expression.test)
                branches.append(f"`{self._snippet(expression.body)}`")
                bodies.append([expression.body])
                expression = expression.orelse
            branches.append(f"`{self._snippet(expression)}`")
            bodies.append([expression])
            found = _Decision(tests, branches, bodies, top_level, branches_of.field_of(ancestors))
            return found if _spans(tests, lines) else None
        if isinstance(node, ast.Assert):
            failure = "AssertionError" + (f": {self._snippet(node.msg)}" if node.msg else "")
            found = _Decision([node.test], [None, failure], [[], []], top_level)
            return found if _spans([node.test], lines) else None
        if isinstance(node, ast.While):
            return _Decision([node.test], [self._first(node.body), None], [node.body, []], False)
        value: ast.expr | None = None
        if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign)) or (
            isinstance(node, ast.keyword) and node.arg
        ):
            value = node.value
        if value is not None and _boolean(value) and _spans([value], lines):
            return _Decision([value], ["`True`", "`False`"], [[], []], False, boolean=True)
        return None

    def _first(self, body: Sequence[ast.stmt]) -> str:
        statement = body[0]
        if isinstance(statement, ast.Raise):
            return f"raises `{self._snippet(statement)}`"
        return f"`{self._snippet(statement)}`"

    def _snippet(self, node: ast.AST) -> str:
        if isinstance(node, ast.expr):
            line = _expression_text(node)
        else:
            number = getattr(node, "lineno", 0)
            line = self.lines[number - 1].strip() if 0 < number <= len(self.lines) else ""
        return line if len(line) <= 70 else line[:67] + "..."

    def _judge(
        self,
        node: ast.AST,
        decision: _Decision,
        ancestors: Sequence[ast.AST],
        function: _Function | None,
    ) -> Finding | None:
        """The decision as a finding: the branches each device takes because of the GPU and
        what they choose (`branches`), or None when 12 takes no branch because of it."""
        evaluator = self.evaluator(function)
        tests = decision.tests
        if not any(evaluator.depends_on_device(test) for test in tests):
            return None
        reached = {d: branches_of.reach(evaluator, tests, d) for d in devices.DEVICES}
        taken = {
            d: branches_of.decided(evaluator, tests, reached, d, others)
            for d, others in _COMPARED.items()
        }
        new = taken[RTX_BLACKWELL]
        if not new and not taken[GB10]:
            return None
        new = new or taken[GB10]
        gets = self._gets(decision, new, node)
        if all(self._gets(decision, [i], node).startswith(_REFUSED) for i in new):
            kind = "refusal"
        elif set(new) - set(reached[B200]):
            kind = "excludes"
        elif any(
            i not in reached[AMPERE]
            and any(
                _open_ended(tests[j], evaluator)
                for j in range(min(i + 1, len(tests)))
                if evaluator.depends_on_device(tests[j])
            )
            for i in new
        ):
            kind = "shares"  # a range or family test groups 12 with 10, apart from 8
        else:
            kind = "decides"
        last = min(new[0], len(tests) - 1)
        decisive = next(
            (t for t in tests[: last + 1] if evaluator.depends_on_device(t)), tests[last]
        )
        line = _device_line(decisive, evaluator)
        code = self.lines[line - 1].strip() if line <= len(self.lines) else ""
        like = self._gets(decision, taken[B200] or reached[B200], node)
        on_gb10 = self._gets(decision, taken[GB10] or reached[GB10], node)
        choices = tuple(
            (_LABELS[device], *choice)
            for device in (RTX_BLACKWELL, GB10, B200)
            for choice in self._choices(decision, taken[device], device, ancestors, function, node)
        )
        head = getattr(node, "lineno", line)
        return Finding(
            self.shown,
            line,
            kind,
            code,
            gets,
            like,
            head,
            choices,
            on_gb10 if on_gb10 != gets else "",
        )

    def _gets(self, decision: _Decision, taken: Sequence[int], node: ast.AST) -> str:
        texts = dict.fromkeys(_describe(decision.branches[i], node) for i in taken)
        return " or ".join(texts) if texts else _describe(None, node)

    def _choices(
        self,
        decision: _Decision,
        taken: Sequence[int],
        device: devices.Device,
        ancestors: Sequence[ast.AST],
        function: _Function | None,
        node: ast.AST,
    ) -> Iterator[tuple[str, str, str, str]]:
        """(kind, record, chosen by, opt-in flag) of each branch `device` takes."""
        evaluator = self.evaluator(function)
        outer = _path(node, ancestors)
        flag = _flag_of(node, function, decision)
        for index in taken:
            found = branches_of.choices(evaluator, decision.bodies[index], device, decision.field)
            if flag is not None and _turns_on(decision, index, evaluator, device, node, function):
                found.append(branches_of.flag(flag))
            if not found:
                continue
            conditions = [
                *outer,
                *((test, False) for test in decision.tests[:index]),
                *((decision.tests[index], True) for _ in range(index < len(decision.tests))),
            ]
            opt = branches_of.opt_in(conditions)
            for kind, name, via in found:
                yield kind, name, via, opt


class _Decision(NamedTuple):
    tests: list[ast.expr]
    branches: list[str | None]  # what each branch does first (None: goes on past it)
    bodies: list[Sequence[ast.AST]]  # each branch's statements, or its expression
    top_level: bool  # a statement of a function's own body
    field: str | None = None  # the flag an expression's branches are assigned to
    boolean: bool = False  # a truth value assigned or returned


_REFUSED = ("raises", "AssertionError")
_LABELS = {RTX_BLACKWELL: "12.0", GB10: "12.1", B200: "10.0"}
# Each device's branches are its own when these others do not take them.
_COMPARED = {
    RTX_BLACKWELL: (AMPERE, devices.HOPPER, B200),
    GB10: (AMPERE, devices.HOPPER, B200),
    B200: (RTX_BLACKWELL, GB10),
}


def _path(node: ast.AST, ancestors: Sequence[ast.AST]) -> list[tuple[ast.expr, bool]]:
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


def _flag_of(node: ast.AST, function: _Function | None, decision: _Decision) -> str | None:
    """The kernel flag (`entries.FLAGS`) this decision sets: its assigned name, or the flag
    function it sits in."""
    if decision.boolean and isinstance(node, ast.Assign):
        for name in _assigned(node):
            if name in entries.FLAGS:
                return name
    if function is not None and function.name in entries.FLAGS:
        return function.name
    return None


def _turns_on(
    decision: _Decision,
    index: int,
    evaluator: Evaluator,
    device: devices.Device,
    node: ast.AST,
    function: _Function | None,
) -> bool:
    """Whether branch `index` leaves the flag on: `True` of a truth value; in a flag function,
    a branch that does not return false (or raise) goes on to turn it on, unless a later
    statement of the function's own body returns false on `device` (an early return)."""
    if decision.boolean:
        return index == 0
    if _refuses(decision.bodies[index]):
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
            and _refuses(statement.body)
            and branches_of.tri(evaluator, statement.test, device) is True
        ):
            return False
    return True


def _refuses(body: Sequence[ast.AST]) -> bool:
    """The statements end by raising or returning false."""
    last = body[-1] if body else None
    if isinstance(last, ast.Raise):
        return True
    return isinstance(last, ast.Return) and (
        last.value is None or (isinstance(last.value, ast.Constant) and not last.value.value)
    )


def _device_line(test: ast.expr, evaluator: Evaluator) -> int:
    """The line of a multi-line test where the device comes in."""
    for part in ast.walk(test):
        if isinstance(
            part, (ast.Compare, ast.Call, ast.Name, ast.Attribute)
        ) and evaluator.depends_on_device(part):
            return part.lineno
    return test.lineno


def _describe(branch: str | None, node: ast.AST) -> str:
    if branch is not None:
        return branch
    return "skips the block" if isinstance(node, (ast.If, ast.While)) else "passes"


def _open_ended(test: ast.expr, evaluator: Evaluator) -> bool:
    """A range (`>= 90`, `< (10, 0)`) or a family helper (`is_blackwell()`) in the test."""
    for part in ast.walk(test):
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
            majors = evaluator.helpers.get(devices.PROBE + probe)
            if majors and NEW in majors and majors & KNOWN:
                return True
        elif isinstance(part, ast.Name) and part.id in evaluator.module_aliases:
            for value, _ in evaluator.module_aliases[part.id]:
                if value is not test and _open_ended(value, evaluator):
                    return True
    return False


def _boolean(value: ast.expr) -> bool:
    if isinstance(value, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.args


def _spans(tests: Sequence[ast.expr], lines: Sequence[int]) -> bool:
    wanted = set(lines)
    return any(
        any(line in wanted for line in range(t.lineno, (t.end_lineno or t.lineno) + 1))
        for t in tests
    )


def _enclosing(ancestors: Sequence[ast.AST]) -> _Function | None:
    for node in reversed(ancestors):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _assigned(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _expression_text(node: ast.expr) -> str:
    try:
        return ast.unparse(node)
    except (ValueError, AttributeError, RecursionError):
        return ""
