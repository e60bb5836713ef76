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

from sglpatch.doctor.findings import Chosen, Finding, Kind
from sglpatch.doctor.gates import branches as branches_of
from sglpatch.doctor.gates import devices, flow
from sglpatch.doctor.gates.decisions import (
    Decision,
    Function,
    assigned,
    conditions_to,
    describe,
    device_line,
    enclosing,
    expression_text,
    flag_of,
    is_boolean,
    open_ended,
    reaches,
    spans,
    turns_on,
)
from sglpatch.doctor.gates.devices import AMPERE, B200, GB10, RTX_BLACKWELL
from sglpatch.doctor.gates.evaluator import Evaluator
from sglpatch.doctor.read.source_tree import walk, walk_with_ancestors

_DECISIONS = (
    ast.If, ast.IfExp, ast.Assert, ast.While, ast.Return, ast.Assign, ast.AnnAssign, ast.keyword
)  # fmt: skip


class Gates:
    """The decisions of one parsed module (or the functions parsed out of it) on given lines."""

    def __init__(
        self,
        tree: ast.Module,
        shown: str,
        lines: Sequence[str],
        helpers: devices.Helpers,
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
        self.kv = flow.KvDtype(tree, (), self.evaluator)

    def evaluator(self, function: Function | None) -> Evaluator:
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
        self.kv.wanted = lines
        tests: list[ast.expr] = []  # of every decision met: the names they read, when asked
        pending: list[tuple[Finding, set[str], Function | None]] = []
        for node, ancestors in walk_with_ancestors(self.tree, lines):
            if id(node) in self.seen:
                continue
            if not isinstance(node, _DECISIONS):
                continue
            decision = self._decision(node, ancestors, lines)
            if decision is None:
                continue
            function = enclosing(ancestors)
            if self._unreachable(node, ancestors, function):
                continue
            tests += decision.tests
            finding = self._judge(node, decision, ancestors, function)
            if finding is None:
                continue
            if finding.kind is Kind.REFUSAL and decision.top_level and function is not None:
                self.refused_after.setdefault(id(function), finding.line)
            names = assigned(node)
            pending.append((finding, names, function))
        tested: set[str] | None = None
        for finding, names, function in pending:
            refused = self.refused_after.get(id(function)) if function is not None else None
            if refused is not None and finding.line > refused and finding.kind is not Kind.REFUSAL:
                continue  # 12 never gets here: the function refused it above
            if names and tested is None:
                tested = {n.id for t in tests for n in walk(t) if isinstance(n, ast.Name)}
            if names and tested is not None and names & tested:
                continue  # a flag tested in this file: reported where it is tested
            yield finding

    def _unreachable(
        self, node: ast.AST, ancestors: Sequence[ast.AST], function: Function | None
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
    ) -> Decision | None:
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
            found = Decision(tests, branches, bodies, top_level)
            return found if spans(tests, lines) else None
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
            found = Decision(tests, branches, bodies, top_level, flow.field_of(ancestors))
            return found if spans(tests, lines) else None
        if isinstance(node, ast.Assert):
            failure = "AssertionError" + (f": {self._snippet(node.msg)}" if node.msg else "")
            found = Decision([node.test], [None, failure], [[], []], top_level)
            return found if spans([node.test], lines) else None
        if isinstance(node, ast.While):
            return Decision([node.test], [self._first(node.body), None], [node.body, []], False)
        value: ast.expr | None = None
        if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign)) or (
            isinstance(node, ast.keyword) and node.arg
        ):
            value = node.value
        if value is not None and is_boolean(value) and spans([value], lines):
            return Decision([value], ["`True`", "`False`"], [[], []], False, boolean=True)
        return None

    def _first(self, body: Sequence[ast.stmt]) -> str:
        statement = body[0]
        if isinstance(statement, ast.Raise):
            return f"raises `{self._snippet(statement)}`"
        return f"`{self._snippet(statement)}`"

    def _snippet(self, node: ast.AST) -> str:
        if isinstance(node, ast.expr):
            line = expression_text(node)
        else:
            number = getattr(node, "lineno", 0)
            line = self.lines[number - 1].strip() if 0 < number <= len(self.lines) else ""
        return line if len(line) <= 70 else line[:67] + "..."

    def _judge(
        self,
        node: ast.AST,
        decision: Decision,
        ancestors: Sequence[ast.AST],
        function: Function | None,
    ) -> Finding | None:
        """The decision as a finding: the branches each device takes because of the GPU and
        what they choose (`branches`), or None when 12 takes no branch because of it."""
        evaluator = self.evaluator(function)
        tests = decision.tests
        if not any(evaluator.depends_on_device(test) for test in tests):
            return None
        reached = {d: branches_of.reach(evaluator, tests, d) for d in devices.DEVICES}
        for device in (RTX_BLACKWELL, GB10):  # an `if` around it that 12 cannot enter
            if not reaches(evaluator, node, ancestors, device):
                reached[device] = []
        taken = {
            d: branches_of.decided(evaluator, tests, reached, d, others)
            for d, others in _COMPARED.items()
        }
        new = taken[RTX_BLACKWELL]
        if not new and not taken[GB10]:
            return None
        new = new or taken[GB10]
        gets = self._gets(decision, new, node)
        kind = self._kind(node, decision, new, reached, evaluator)
        last = min(new[0], len(tests) - 1)
        decisive = next(
            (t for t in tests[: last + 1] if evaluator.depends_on_device(t)), tests[last]
        )
        line = device_line(decisive, evaluator)
        code = self.lines[line - 1].strip() if line <= len(self.lines) else ""
        like = self._gets(decision, taken[B200] or reached[B200], node)
        on_gb10 = self._gets(decision, taken[GB10] or reached[GB10], node)
        choices = tuple(
            Chosen(_LABELS[device], kind_, name, via, opt)
            for device in (RTX_BLACKWELL, GB10, B200)
            for kind_, name, via, opt in self._choices(
                decision, taken[device], device, ancestors, function, node
            )
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

    def _kind(
        self,
        node: ast.AST,
        decision: Decision,
        new: Sequence[int],
        reached: Mapping[devices.Device, Sequence[int]],
        evaluator: Evaluator,
    ) -> Kind:
        """How 12 comes to take branches `new` (see the module's docstring)."""
        tests = decision.tests
        if all(self._gets(decision, [i], node).startswith(_REFUSED) for i in new):
            return Kind.REFUSAL
        if set(new) - set(reached[B200]):
            return Kind.EXCLUDES
        if any(
            i not in reached[AMPERE]
            and any(
                open_ended(tests[j], evaluator)
                for j in range(min(i + 1, len(tests)))
                if evaluator.depends_on_device(tests[j])
            )
            for i in new
        ):
            return Kind.SHARES  # a range or family test groups 12 with 10, apart from 8
        return Kind.DECIDES

    def _gets(self, decision: Decision, taken: Sequence[int], node: ast.AST) -> str:
        texts = dict.fromkeys(describe(decision.branches[i], node) for i in taken)
        return " or ".join(texts) if texts else describe(None, node)

    def _choices(
        self,
        decision: Decision,
        taken: Sequence[int],
        device: devices.Device,
        ancestors: Sequence[ast.AST],
        function: Function | None,
        node: ast.AST,
    ) -> Iterator[tuple[str, str, str, str]]:
        """(kind, record, chosen by, opt-in flag) of each branch `device` takes."""
        evaluator = self.evaluator(function)
        outer = conditions_to(node, ancestors)
        flag = flag_of(node, function, decision)
        # A function choosing a backend flag's default (0.5.16+'s `get_default_attn_backend`)
        # chooses with what its branches return.
        name = function.name if function is not None else ""
        returns = name if "default" in name else None
        for index in taken:
            found = branches_of.choices(
                evaluator, decision.bodies[index], device, decision.field, returns
            )
            if decision.field == flow.KV:
                found += self.kv.arm_choices(decision.bodies[index], device)
            if flag is not None and turns_on(decision, index, evaluator, device, node, function):
                found.append(branches_of.flag(flag))
            if not found:
                continue
            conditions = [
                *outer,
                *((test, False) for test in decision.tests[:index]),
                *((decision.tests[index], True) for _ in range(index < len(decision.tests))),
            ]
            opt = branches_of.opt_in(conditions, self.kv.defaults(device))
            for kind, name, via in found:
                yield kind, name, via, opt


_REFUSED = ("raises", "AssertionError")
_LABELS = {device: "{}.{}".format(*device) for device in (RTX_BLACKWELL, GB10, B200)}
# Each device's branches are its own when these others do not take them.
_COMPARED = {
    RTX_BLACKWELL: (AMPERE, devices.HOPPER, B200),
    GB10: (AMPERE, devices.HOPPER, B200),
    B200: (RTX_BLACKWELL, GB10),
}
