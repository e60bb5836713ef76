"""Capability gates in SGLang's source, and what a capability-12 GPU gets at each.

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
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor import chunks, devices
from sglpatch.doctor.devices import AMPERE, B200, RTX_BLACKWELL, Evaluator
from sglpatch.doctor.source_tree import Source, chain, parallel, walk_with_ancestors

MAJORS = frozenset(range(7, 14))  # plausible compute-capability majors
KNOWN = frozenset({9, 10})
NEW = devices.NEW


class Finding(NamedTuple):
    file: str  # sglang/...
    line: int
    kind: str  # excludes, shares, table or refusal
    code: str  # the line of the deciding test
    gets: str  # what capability 12 gets there
    like: str  # what capability 10 gets there

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity across an edit that moves lines: a patch covers a finding it removes."""
        return (self.file, self.kind, self.code, self.gets)


# Quick byte tests before any parsing: a capability word, a helper, or a dict row keyed 9/10.
_ROW = re.compile(rb"(?:^|[{,])\s*(?:9|10)\s*:", re.MULTILINE)
_WORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"get_device_sm")


def scan(source: Source, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    jobs = [
        (path, source.shown(path), helpers)
        for path in sorted(source.package_dir.rglob("*.py"))
        if not _is_test(path.relative_to(source.package_dir).parts)
    ]
    return [finding for findings in parallel(_scan_path, jobs) for finding in findings]


def _is_test(parts: tuple[str, ...]) -> bool:
    """SGLang ships its tests and benchmarks; they gate what they test, not what a server runs."""
    return any(p in ("test", "tests", "benchmark") for p in parts[:-1]) or parts[-1].startswith(
        "test_"
    )


def _scan_path(job: tuple[Path, str, Mapping[str, frozenset[int]]]) -> list[Finding]:
    path, shown, helpers = job
    try:
        data = path.read_bytes()
    except OSError:
        return []
    return scan_bytes(data, shown, helpers)


def scan_bytes(data: bytes, shown: str, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    """The findings in one file's bytes; `shown` names it (`sglang/srt/...`)."""
    rows = (b"9:" in data or b"10:" in data) and _ROW.search(data) is not None
    if not rows and not any(word in data for word in _WORDS):
        return []
    text = data.decode("utf-8", errors="replace")
    starts = _Starts(data)
    source_lines = text.splitlines()
    lines = _with_aliases(text, data, starts, _keyword_lines(data, starts, source_lines))
    if not lines and not rows:
        return []
    # Tables need every read of their name, so a file with rows is parsed whole.
    tree = None if rows else chunks.parse(source_lines, lines)
    if tree is None:
        try:
            tree = ast.parse(data, filename=shown)
        except (SyntaxError, ValueError):
            return []
    # A module's own `def is_blackwell()` is not SGLang's helper of that name.
    defined = frozenset(_DEFINED.findall(text)) if "def is_" in text else frozenset()
    found = list(_Scan(tree, shown, source_lines, helpers, defined).run(lines)) if lines else []
    if rows:
        found += _tables(tree, shown, source_lines)
    return sorted(set(found), key=lambda f: (f.line, f.kind))


class _Starts:
    """Line numbers of byte offsets, counted on demand: most files need a handful."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def lines(self, offsets: Iterator[int]) -> list[int]:
        found = []
        line, previous = 1, 0
        for offset in sorted(offsets):
            line += self.data.count(b"\n", previous, offset)
            previous = offset
            found.append(line)
        return found


_DEFINED = re.compile(r"^\s*def\s+(is_\w+)", re.MULTILINE)
_DEVICE_VALUE = re.compile(r"is_sm\d|blackwell|hopper_with|get_device_sm|apabilit|APABILIT")
_ASSIGNED = re.compile(r"^\s*([A-Za-z_][\w, ()]*?)\s*=(?!=)")


def _lines_of(matches: Iterator[re.Match[bytes]], starts: _Starts) -> list[int]:
    return sorted(set(starts.lines(m.start() for m in matches)))


_KEYWORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"get_device_sm", b"hopper_with",
             b"ampere_with", b"major")  # fmt: skip


def _keyword_lines(data: bytes, starts: _Starts, lines: Sequence[str]) -> list[int]:
    """Code lines holding a capability word: bytes.find beats one alternation regex by far."""
    offsets = []
    for word in _KEYWORDS:
        index = data.find(word)
        while index != -1:
            end = index + len(word)
            if word == b"major":
                whole = not (index and _WORD_BYTE.match(data, index - 1)) and not _WORD_BYTE.match(
                    data, end
                )
            elif word == b"is_sm":
                whole = data[end : end + 1].isdigit()
            else:
                whole = True
            if whole:
                offsets.append(index)
            newline = data.find(b"\n", index)
            if newline == -1:
                break
            index = data.find(word, newline)
    return sorted({n for n in starts.lines(iter(offsets)) if _evaluable(lines[n - 1])})


_WORD_BYTE = re.compile(rb"\w")
_HELPER_WORD = re.compile(
    r"is_sm\d|blackwell|hopper_with|ampere_with|get_device_sm|get_device_capab"
)
_OPERATION = re.compile(r"[<>]|[=!]=|\bin\b|\[\s*[01]\s*\]|^\s*[\w, ()]+=")


def _evaluable(line: str) -> bool:
    """Code that can take part in a gate: a helper, or a comparison, index or assignment.

    Prose that mentions a major version (a docstring, an error message) is left unparsed.
    """
    stripped = line.lstrip()
    if stripped.startswith("#"):
        return False
    return _HELPER_WORD.search(line) is not None or _OPERATION.search(line) is not None


def _code_lines(
    matches: Iterator[re.Match[bytes]], starts: _Starts, lines: Sequence[str]
) -> list[int]:
    """Lines with a match, comments left out."""
    return [n for n in _lines_of(matches, starts) if not lines[n - 1].lstrip().startswith("#")]


def _with_aliases(text: str, data: bytes, starts: _Starts, lines: list[int]) -> list[int]:
    """Add the lines that use a name assigned on a candidate line (`sm = get_device_sm()`)."""
    found = set(lines)
    done: set[str] = set()
    source_lines = text.splitlines()
    new = list(lines)
    for _ in range(2):
        names: set[str] = set()
        for line in new:
            text_line = source_lines[line - 1] if line <= len(source_lines) else ""
            match = _ASSIGNED.match(text_line)
            # Only a value made from the device (`sm = get_device_sm()`) makes an alias.
            if match and _DEVICE_VALUE.search(text_line, match.end()):
                names |= {n.strip(" ()") for n in match.group(1).split(",")}
        names = {n for n in names if n.isidentifier()} - done
        if not names:
            break
        done |= names
        pattern = re.compile(
            rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(names)) + rb")\b"
        )
        new = [
            n for n in _code_lines(pattern.finditer(data), starts, source_lines) if n not in found
        ]
        found |= set(new)
    return sorted(found)


_TWELVE = re.compile(r"12")
_DECISIONS = (
    ast.If, ast.IfExp, ast.Assert, ast.While, ast.Return, ast.Assign, ast.AnnAssign, ast.keyword
)  # fmt: skip
_Function = ast.FunctionDef | ast.AsyncFunctionDef


class _Scan:
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
                isinstance(node, (ast.Compare, ast.Call)) and evaluator.names_new(node)
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
        if isinstance(part, (ast.Compare, ast.Call, ast.Name)) and evaluator.depends_on_device(
            part
        ):
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


# --- tables keyed by majors ------------------------------------------------------------------


def _tables(tree: ast.Module, shown: str, lines: Sequence[str]) -> list[Finding]:
    tables: list[tuple[int, set[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            keys = _int_keys(node.value)
            if keys and keys <= MAJORS and keys & KNOWN and NEW not in keys:
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
