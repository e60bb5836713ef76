"""One module's capability gates, judged: what a capability-12 GPU gets at each.

Every decision that depends on the GPU (an `if`/`elif` chain, a conditional expression, an
`assert`, a boolean a function returns or a flag it sets) is evaluated for capability 8, 9, 10
and 12 (see `devices`). A decision is reported when:

- `excludes`: 12 takes another branch than 10 (`is_sm100_supported()`, `== 10`, `in (9, 10)`);
- `shares`: a range or family test (`get_device_sm() >= 90`, `is_blackwell()`) sends 12 down
  the path of 9 or 10 that it keeps from 8, which may be an SM90/SM100-only path;
- `table`: a dict keyed by majors that knows 9 or 10, not 12, is subscripted (`KeyError: 12`).

It is not reported when the same chain or function names 12 itself (`is_sm120_supported()`,
`== 12`, `in (8, 12)`): that code has thought about 12. A branch for 12 that raises (or an
`assert` that fails) is a deliberate refusal, listed apart; code after a refusal at the top of a
function is not reached on 12. These are heuristics: the verdict counts them as suspects.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence

from sglpatch.doctor import devices
from sglpatch.doctor.devices import AMPERE, B200, RTX_BLACKWELL
from sglpatch.doctor.evaluator import Evaluator
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import walk_with_ancestors

KNOWN = frozenset({9, 10})
NEW = devices.NEW
_TWELVE = re.compile(r"12")
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
        self.handles_new: dict[int, bool] = {}
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

    def function_handles_new(self, function: _Function | None) -> bool:
        if function is None:
            return False
        key = id(function)
        if key not in self.handles_new:
            text = "\n".join(self.lines[function.lineno - 1 : function.end_lineno])
            if not _TWELVE.search(text):
                self.handles_new[key] = False
                return False
            evaluator = self.evaluator(function)
            self.handles_new[key] = any(
                isinstance(node, (ast.Compare, ast.Call, ast.Attribute))
                and evaluator.names_new(node)
                for node in ast.walk(function)
            )
        return self.handles_new[key]

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
            tests, branches, top_level = decision
            for test in tests:
                tested |= {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            finding = self._judge(node, tests, branches, function)
            if finding is None:
                continue
            if finding.kind == "refusal" and top_level and function is not None:
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
    ) -> tuple[list[ast.expr], list[str | None], bool] | None:
        """The tests of a decision and what each branch does (None: goes on past it)."""
        parent = ancestors[-1] if ancestors else None
        top_level = isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef))
        tests: list[ast.expr] = []
        branches: list[str | None] = []
        if isinstance(node, ast.If):
            current: ast.If | None = node
            while current is not None:
                self.seen.add(id(current))
                tests.append(current.test)
                branches.append(self._first(current.body))
                orelse = current.orelse
                if len(orelse) == 1 and isinstance(orelse[0], ast.If):
                    current = orelse[0]
                else:
                    branches.append(self._first(orelse) if orelse else None)
                    current = None
            return (tests, branches, top_level) if _spans(tests, lines) else None
        if isinstance(node, ast.IfExp):
            expression: ast.expr = node
            while isinstance(expression, ast.IfExp):
                self.seen.add(id(expression))
                tests.append(expression.test)
                branches.append(f"`{self._snippet(expression.body)}`")
                expression = expression.orelse
            branches.append(f"`{self._snippet(expression)}`")
            return (tests, branches, top_level) if _spans(tests, lines) else None
        if isinstance(node, ast.Assert):
            failure = "AssertionError" + (f": {self._snippet(node.msg)}" if node.msg else "")
            return ([node.test], [None, failure], top_level) if _spans([node.test], lines) else None
        if isinstance(node, ast.While):
            return ([node.test], [self._first(node.body), None], False)
        value: ast.expr | None = None
        if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign)) or (
            isinstance(node, ast.keyword) and node.arg
        ):
            value = node.value
        if value is not None and _boolean(value) and _spans([value], lines):
            return ([value], ["`True`", "`False`"], False)
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
        tests: list[ast.expr],
        branches: list[str | None],
        function: _Function | None,
    ) -> Finding | None:
        evaluator = self.evaluator(function)
        if not any(evaluator.depends_on_device(test) for test in tests):
            return None
        if any(evaluator.names_new(test) for test in tests) or self.function_handles_new(function):
            return None  # this code has thought about 12
        for world in (True, False):
            taken = {
                device: _branch(tests, evaluator, device, world)
                for device in (AMPERE, devices.HOPPER, B200, RTX_BLACKWELL)
            }
            new, old = taken[RTX_BLACKWELL], taken[B200]
            if new != old:
                kind = "excludes"
                decisive = tests[min(new, old)]
            elif taken[AMPERE] != new and _open_ended(tests[min(new, taken[AMPERE])], evaluator):
                kind = "shares"  # a range or family test groups 12 with 10, apart from 8
                decisive = tests[min(new, taken[AMPERE])]
            else:
                continue
            gets = _describe(branches[new], node)
            if gets.startswith(("raises", "AssertionError")):
                kind = "refusal"
            line = _device_line(decisive, evaluator)
            code = self.lines[line - 1].strip() if line <= len(self.lines) else ""
            return Finding(self.shown, line, kind, code, gets, _describe(branches[old], node))
        return None


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


def _branch(
    tests: Sequence[ast.expr], evaluator: Evaluator, device: devices.Device, world: bool
) -> int:
    for index, test in enumerate(tests):
        if evaluator.truth(test, device, world):
            return index
    return len(tests)


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
