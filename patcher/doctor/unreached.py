"""Decisions a patch takes away from capability 12 by changing their input in another function.

Coverage is otherwise seen by scanning the patched file again (`coverage.covered_by`). That
cannot see a patch like sm120-fp8-block-gemm-triton: it turns `auto` into `triton` in
`initialize_fp8_gemm_config`, so `dispatch_w8a8_block_fp8_linear` never calls
`_dispatch_auto_backend` on 12, while the decision inside that function reads the same before
and after. Such a patch names those functions (`Patch.unreached_on_12`), and its tests prove it
on the release's own code. Here, a decision inside one of them is covered by the patch while it
is pending, and is not 12's once it is in the tree.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Sequence

from sglpatch.doctor.coverage import PatchCheck
from sglpatch.doctor.findings import Finding
from sglpatch.results import AlreadyApplied, Applied

Read = Callable[[str], bytes | None]  # a file's current bytes (sglang/...), None if unreadable


def covered(
    findings: Sequence[Finding], work: Sequence[PatchCheck], read: Read
) -> dict[Finding, str]:
    """finding -> the first pending patch (by id) that declares its function unreached on 12."""
    return _inside(findings, [c for c in work if isinstance(c.outcome, Applied)], read)


def settled(findings: Sequence[Finding], checks: Sequence[PatchCheck], read: Read) -> set[Finding]:
    """The findings inside a function that a patch in the tree already declares unreached."""
    present = [c for c in checks if isinstance(c.outcome, AlreadyApplied)]
    return set(_inside(findings, present, read))


def _inside(
    findings: Sequence[Finding], checks: Iterable[PatchCheck], read: Read
) -> dict[Finding, str]:
    found: dict[Finding, str] = {}
    for check in sorted(checks, key=lambda c: c.patch.id):
        names = set(check.patch.unreached_on_12)
        here = [f for f in findings if f.file == check.file]
        if not names or not here:
            continue
        data = read(check.file)
        spans = _functions(data) if data is not None else []
        for finding in here:
            if _holding(spans, finding.head or finding.line) in names:
                found.setdefault(finding, check.patch.id)
    return found


def _functions(data: bytes) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every function the file defines."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [
        (node.lineno, node.end_lineno or node.lineno, node.name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _holding(spans: Sequence[tuple[int, int, str]], line: int) -> str | None:
    """The innermost function around `line`."""
    around = [s for s in spans if s[0] <= line <= s[1]]
    return max(around, key=lambda s: s[0])[2] if around else None
