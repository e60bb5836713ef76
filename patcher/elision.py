"""Parse only the definitions the patches read, and put the rest back in their output.

libcst's parse is most of what a run costs, and SGLang's large modules hold the few functions a
patch edits among a hundred it never reads (0.5.23's overrides.py: 2 of 68 functions, 16 of 76 kB).
A patch that declares `reads` (top-level `def`/`class` names of its file, or `Class.method`) runs
over the file with every other top-level `def` and `class` (and, in a class named `Class.method`,
every other method) replaced by a one-line placeholder statement at the same place and
indentation; `splice` then puts each original statement back in place of its placeholder.

A placeholder stands for exactly the node libcst makes of the statement: its lines, and the
comment and blank lines after it that libcst gives to its block's footer (those up to the last
one indented as deep as its body), so that code a patch inserts beside it lands where it would
in the whole file. The other statements, comments and blank lines stay as they are. Nothing up
to the file's first indented block is left out: libcst takes the file's indentation from it.

The whole file is parsed instead (`elide` gives None) when it cannot be cut safely: `ast` cannot
parse it, it declares an encoding other than UTF-8 or starts with a BOM, it holds the
placeholders' prefix, a definition does not have its lines to itself, ends in a backslash, or is
followed by lines indented with tabs or form feeds; and (`splice` gives None) when the patch
moved, copied or dropped a placeholder.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

_PREFIX = b"_sglpatch_elided_"
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BLANK = b" \t\f"
# PEP 263: a coding comment on line 1 or 2. The placeholders are UTF-8 bytes; another encoding is
# parsed whole.
_CODING = re.compile(rb"\A(?:[^\r\n]*(?:\r\n|\r|\n))?[ \t\f]*#[^\r\n]*coding[:=][ \t]*([-\w.]+)")
_UTF8 = {b"utf-8", b"utf8", b"utf_8"}


class Elided(NamedTuple):
    text: bytes  # what is parsed: the source, the statements left out as placeholders
    held: tuple[tuple[bytes, bytes], ...]  # (placeholder line, the statement's own lines), in order


def elide(source: bytes, reads: Collection[str]) -> Elided | None:
    """`source` with what `reads` does not name left out; None: parse it whole (see above)."""
    coding = _CODING.match(source)
    if coding and coding.group(1).lower() not in _UTF8:
        return None
    if _PREFIX in source or source.startswith(b"\xef\xbb\xbf"):
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = source.splitlines(keepends=True)
    spans = _left_out(tree.body, lines, reads)
    if spans is None or not spans:
        return None
    text: list[bytes] = []
    held: list[tuple[bytes, bytes]] = []
    line = 0
    for first, last in spans:  # 0-based, inclusive, in order
        statement = lines[first : last + 1]
        if not _alone(statement):
            return None
        indent = statement[0][: len(statement[0]) - len(statement[0].lstrip(_BLANK))]
        ending = statement[-1][len(statement[-1].rstrip(b"\r\n")) :]
        placeholder = b"%s%s%d%s" % (indent, _PREFIX, len(held), ending)
        text += lines[line:first]
        text.append(placeholder)
        held.append((placeholder, b"".join(statement)))
        line = last + 1
    text += lines[line:]
    return Elided(b"".join(text), tuple(held))


def splice(elided: Elided, after: bytes) -> bytes | None:
    """`after` (the elided text, patched) with each statement back in its placeholder's place;
    None when a placeholder is not where it can be found once, whole and in order."""
    pieces: list[bytes] = []
    at = 0
    for placeholder, statement in elided.held:
        found = after.find(placeholder, at)
        while found > 0 and after[found - 1 : found] not in (b"\n", b"\r"):
            found = after.find(placeholder, found + 1)  # only a whole line stands for it
        if found < 0:
            return None
        pieces += [after[at:found], statement]
        at = found + len(placeholder)
    pieces.append(after[at:])
    spliced = b"".join(pieces)
    return None if _PREFIX in spliced else spliced


def _left_out(
    body: Sequence[ast.stmt], lines: Sequence[bytes], reads: Collection[str]
) -> list[tuple[int, int]] | None:
    """(first, last) 0-based lines of the statements to leave out, in order; None: one cannot
    be left out safely."""
    whole = {name for name in reads if "." not in name}
    members: dict[str, set[str]] = {}
    for name in reads:
        if "." in name:
            owner, member = name.split(".", 1)
            members.setdefault(owner, set()).add(member)
    spans: list[tuple[int, int]] = []
    opened = False  # libcst reads the default indentation off the file's first block
    for node in body:
        if not opened:
            opened = _opens_block(node, lines)
            if not (isinstance(node, ast.ClassDef) and node.name in members):
                continue
        if not isinstance(node, _DEFINITIONS) or node.name in whole:
            continue
        if isinstance(node, ast.ClassDef) and node.name in members:
            wanted = members[node.name]
            found = [
                _span(member, lines)
                for member in node.body
                if isinstance(member, _DEFINITIONS[:2]) and member.name not in wanted
            ]
        else:
            found = [_span(node, lines)]
        if None in found:
            return None
        spans += [span for span in found if span is not None]
    return spans


def _span(node: ast.stmt, lines: Sequence[bytes]) -> tuple[int, int] | None:
    """The statement's lines with its footer's (see the module's docstring); None: unsafe."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)]) - 1
    last = (node.end_lineno or node.lineno) - 1
    if lines[last].rstrip(b"\r\n").endswith(b"\\"):
        return None  # continued onto the next line
    body: list[ast.stmt] = getattr(node, "body", [])
    depth = body[0].col_offset if _opens_block(node, lines) else None
    for index in range(last + 1, len(lines)):
        content = lines[index].rstrip(b"\r\n")
        rest = content.lstrip(_BLANK)
        indent = content[: len(content) - len(rest)]
        if b"\t" in indent or b"\f" in indent:
            return None  # how deep libcst counts it is not a count of bytes
        if rest and not rest.startswith(b"#"):
            break  # the next statement
        if depth is not None and len(indent) >= depth:
            last = index  # libcst's footer: up to the last line as deep as the block
    return first, last


def _opens_block(node: ast.stmt, lines: Sequence[bytes]) -> bool:
    """Whether the statement's body starts on a line of its own (an indented block)."""
    body: list[ast.stmt] = getattr(node, "body", [])
    if not body or body[0].lineno <= node.lineno:
        return False
    first = body[0]
    if lines[first.lineno - 2].rstrip(b"\r\n").endswith(b"\\"):
        return False  # `def f(): \` continued: one logical line, no indented block
    return not lines[first.lineno - 1][: first.col_offset].strip(_BLANK)


def _alone(statement: Sequence[bytes]) -> bool:
    """A definition's lines hold nothing else: it starts its first line, after the indentation."""
    return statement[0].lstrip(_BLANK).startswith((b"@", b"def", b"async", b"class"))
