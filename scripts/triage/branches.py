"""The `if` chain a changed line belongs to: the `branch` family of the triage's gates."""

from __future__ import annotations

import re
from collections.abc import Sequence

# `branch`: a changed line that is an `elif`/`else` of, or a line directly in the body of, an
# `if` chain whose conditions match a family of GATES (patterns.py; e.g. the `else:` after
# `if is_sm100():`, which 12 reaches), in a hunk that names SM100-only code. This is how a fix
# that changes what such a gate selects is found.
BRANCH_KEYWORD = re.compile(r"^\s*(if|elif|else)\b")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _header_above(lines: Sequence[str], index: int, level: int) -> int | None:
    """The `if`/`elif`/`else` line at indentation `level` that ends above `index`, if any.

    A header spanning lines (`if (` ... `):`) is found by its first line.
    """
    j = index - 1
    while j >= 0 and (not _is_code(lines[j]) or _indent(lines[j]) > level):
        j -= 1
    while j >= 0 and lines[j].lstrip()[:1] in ")]}":  # the closing line of a long header
        j -= 1
        while j >= 0 and (not _is_code(lines[j]) or _indent(lines[j]) > level):
            j -= 1
    if j < 0 or _indent(lines[j]) != level or not BRANCH_KEYWORD.match(lines[j]):
        return None
    return j


def _condition(lines: Sequence[str], header: int) -> str:
    """The header's text up to its colon (a long condition spans lines)."""
    text = []
    for line in lines[header : header + 12]:
        text.append(line.split("#", 1)[0])
        if text[-1].rstrip().endswith(":"):
            break
    return " ".join(text)


def branch_conditions(lines: Sequence[str], index: int) -> str:
    """The conditions of the `if` chain whose `elif`/`else` or direct body `lines[index]` is.

    Empty when the line is neither (an `if` line is its own condition, matched as a line).
    """
    line = lines[index]
    if not _is_code(line):
        return ""
    keyword = BRANCH_KEYWORD.match(line)
    if keyword and keyword.group(1) != "if":
        header: int | None = index
    else:
        above = index - 1
        while above >= 0 and (not _is_code(lines[above]) or _indent(lines[above]) >= _indent(line)):
            above -= 1
        if above < 0:
            return ""
        header = _header_above(lines, above + 1, _indent(lines[above]))
    conditions = []
    while header is not None:
        conditions.append(_condition(lines, header))
        if BRANCH_KEYWORD.match(lines[header]).group(1) == "if":  # type: ignore[union-attr]
            break
        header = _header_above(lines, header, _indent(lines[header]))
    return " ".join(conditions) if conditions else ""
