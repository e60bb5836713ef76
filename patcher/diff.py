"""Unified diffs that `git apply` and `patch -p1` accept at the target root."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Literal

NO_NEWLINE = "\\ No newline at end of file\n"
Opcode = tuple[Literal["replace", "delete", "insert", "equal"], int, int, int, int]


def unified(path: str, before: bytes, after: bytes, context: int = 3) -> str:
    """A git-style diff of one file (`a/` and `b/` prefixes), byte-faithful for UTF-8 text."""
    old = _split(before.decode("utf-8"))
    new = _split(after.decode("utf-8"))
    hunks = "".join(_hunks(old, new, context))
    if not hunks:
        return ""
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{hunks}"


def _split(text: str) -> list[str]:
    """Lines as git and patch see them: split on LF only (str.splitlines also splits on
    form feeds and Unicode separators, which may sit inside Python strings)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _hunks(old: list[str], new: list[str], context: int) -> Iterator[str]:
    """The hunks `difflib.unified_diff` would give, computed on the part that differs.

    Edits are small and files are long: the common head and tail are matched first, so
    SequenceMatcher only compares the few lines between them.
    """
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    middle = difflib.SequenceMatcher(
        None, old[head : len(old) - tail], new[head : len(new) - tail], autojunk=False
    )
    opcodes: list[Opcode] = [("equal", 0, head, 0, head)] if head else []
    opcodes += [
        (tag, i1 + head, i2 + head, j1 + head, j2 + head)
        for tag, i1, i2, j1, j2 in middle.get_opcodes()
    ]
    if tail:
        opcodes.append(("equal", len(old) - tail, len(old), len(new) - tail, len(new)))
    for group in _Grouping(opcodes).get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        old_range = _range(first[1], last[2] - first[1])
        yield f"@@ -{old_range} +{_range(first[3], last[4] - first[3])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from _lines(" ", old[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from _lines("-", old[i1:i2])
            if tag in ("replace", "insert"):
                yield from _lines("+", new[j1:j2])


class _Grouping(difflib.SequenceMatcher[str]):
    """difflib's hunk grouping, over opcodes computed elsewhere."""

    def __init__(self, opcodes: list[Opcode]) -> None:
        super().__init__(None, [], [])
        self._opcodes = opcodes

    def get_opcodes(self) -> list[Opcode]:
        return list(self._opcodes)


def _range(start: int, length: int) -> str:
    """A hunk range as diff(1) writes it: 1-based, the length omitted when it is 1."""
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"


def _lines(prefix: str, lines: list[str]) -> Iterator[str]:
    for line in lines:
        if line.endswith("\n"):
            yield prefix + line
        else:  # the file's last line has no newline: say so, as diff(1) does
            yield prefix + line + "\n" + NO_NEWLINE
