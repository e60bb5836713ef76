"""Parse only the parts of a module that hold given lines: the innermost `def` around each, or
the top-level statement when there is none; of a `def` or `class`, only its header and the
statements of its body that hold a wanted or a context line.

doctor's time goes into `ast.parse`: SGLang's gates sit in a few statements of long functions in
large modules (server_args.py is 200 kB), so parsing those statements is several times cheaper
than parsing the functions, let alone the modules. Blocks are found by indentation; when the
statements do not parse on their own the whole blocks are tried, and when those do not either (a
string starting at column 0 inside a function, say) the caller parses the whole module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

from sglpatch.doctor.read.source_tree import without_strings

_DEF = re.compile(r"(\s*)(?:async\s+)?def\s")
_STATEMENT_START = re.compile(r"[A-Za-z_@]")
# Lines at a block's own indentation that still belong to it.
_CONTINUES = re.compile(r"[)\]}]|(?:else|elif|except|finally)\b")


def _indent(line: str) -> int | None:
    """Leading whitespace, or None for a line that cannot end a block (blank or comment)."""
    stripped = line.lstrip()
    if not stripped or stripped.startswith("#"):
        return None
    return len(line) - len(stripped)


def blocks(lines: Sequence[str], wanted: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first line, last line, indentation) of the blocks holding `wanted` (1-based lines)."""
    found: list[tuple[int, int, int]] = []
    covered_until = 0
    for line in sorted(wanted):
        if line <= covered_until or line > len(lines):
            continue
        start, indent = _enclosing(lines, line - 1)
        end = block_end(lines, start, indent)
        found.append((start + 1, end + 1, indent))
        covered_until = end + 1
    merged: list[tuple[int, int, int]] = []
    for start, end, indent in sorted(found):
        if merged and start <= merged[-1][1]:
            first, last, outer = merged[-1]
            if indent < outer or (indent == outer and start < first):
                merged[-1] = (min(first, start), max(last, end), indent)
            else:
                merged[-1] = (first, max(last, end), outer)
        else:
            merged.append((start, end, indent))
    return merged


def _enclosing(lines: Sequence[str], index: int) -> tuple[int, int]:
    """The innermost `def` above line `index` that holds it, else its top-level statement."""
    current = _indent(lines[index])
    if current is None:
        current = 0
    if _DEF.match(lines[index]) and current == 0:
        return index, 0
    for above in range(index, -1, -1):
        text = lines[above]
        indent = _indent(text)
        if indent is None or (above != index and _continues(lines, above)):
            continue  # `) -> None:` closes a signature: it is no block of its own
        if indent < current or (above == index and _DEF.match(text)):
            match = _DEF.match(text)
            if match:
                return above, indent
            current = indent
        if indent == 0 and _STATEMENT_START.match(text) and not _CONTINUES.match(text):
            return above, 0
    return 0, 0


def _continues(lines: Sequence[str], index: int) -> bool:
    """A column-0 line inside a bracket opened above (`)` closing a call) is no start."""
    return lines[index].lstrip().startswith((")", "]", "}"))


def block_end(lines: Sequence[str], start: int, indent: int) -> int:
    """The last line of the block whose header is at `start`."""
    last = start
    for index in range(start + 1, len(lines)):
        text = lines[index]
        stripped = text.lstrip()  # `_indent`, inline: this loop runs over whole functions
        if not stripped or stripped[0] == "#":
            continue
        level = len(text) - len(stripped)
        if level <= indent and not (level == indent and _CONTINUES.match(text, level)):
            break
        last = index
    return last


class Parsed(NamedTuple):
    tree: ast.Module
    lines: list[str]  # the text that was parsed: the blocks, one after another, at column 0
    real: list[int]  # real[n] is the module's line number of parsed line n (1-based; real[0] = 0)

    def wanted(self, lines: Sequence[int]) -> list[int]:
        """Module line numbers -> the parsed text's."""
        index = {line: n for n, line in enumerate(self.real) if n}
        return [index[line] for line in lines if line in index]


def parse(
    lines: Sequence[str], wanted: Sequence[int], context: Collection[int] = ()
) -> Parsed | None:
    """The blocks around `wanted`, parsed as one text (one parse per file, no padding).

    Of a block that is a `def` or `class`, only the header and the body statements holding a
    line of `wanted` or of `context` are kept: `context` names lines the caller needs beside
    the wanted ones (a function's own test for 12, say), without making blocks of their own.
    """
    found = blocks(lines, wanted)
    keep = {*wanted, *context}
    narrowed = [piece for block in found for piece in _statements(lines, block, keep)]
    attempts = [narrowed, found] if narrowed != found else [found]
    for pieces in attempts:
        while True:
            text: list[str] = []
            real = [0]
            for start, end, indent in pieces:
                for index in range(start - 1, end):
                    text.append(_dedent(lines[index], indent))
                    real.append(index + 1)
            try:
                return Parsed(ast.parse("\n".join(text)), text, real)
            except SyntaxError as error:
                at = error.lineno or 0
                prose = _prose(pieces, real[at] if 0 < at < len(real) else 0)
                if prose is None:
                    break
                pieces = [piece for piece in pieces if piece != prose]
            except ValueError:
                break
    return None


def _prose(pieces: Sequence[tuple[int, int, int]], line: int) -> tuple[int, int, int] | None:
    """The piece that is line `line` alone at column 0, when it is one: inside a module's
    docstring, prose that names a capability is no statement, and is left out."""
    for piece in pieces:
        if piece == (line, line, 0):
            return piece
    return None


def matching_lines(text: str, pattern: re.Pattern[str]) -> list[int]:
    """The numbers of the lines `pattern` matches on, counted as the matches go."""
    found: list[int] = []
    line, counted = 1, 0
    for match in pattern.finditer(text):
        line += text.count("\n", counted, match.start())
        counted = match.start()
        if not found or found[-1] != line:
            found.append(line)
    return found


def around(text: str, pattern: re.Pattern[str]) -> ast.Module | None:
    """The parts of a module around the lines matching `pattern`, parsed (the whole module when
    they do not parse alone); None when nothing matches or the module does not parse."""
    lines = matching_lines(text, pattern)
    if not lines:
        return None
    chunk = parse(text.splitlines(), lines)
    if chunk is not None:
        return chunk.tree
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _statements(
    lines: Sequence[str], block: tuple[int, int, int], keep: Collection[int]
) -> list[tuple[int, int, int]]:
    """A `def` or `class` block as its header and the body statements holding a `keep` line
    (the first one, when only the header holds one); any other block as `_kept` keeps it."""
    start, end, indent = block
    if not _HEADER.match(lines[start - 1]):
        return [(a, b, indent) for a, b in _kept(lines, start, end, keep)]
    header_end = _header_end(lines, start, end)
    body = _body_statements(lines, header_end + 1, end) if header_end is not None else []
    if header_end is None or not body:
        return [block]
    pieces = [(start, header_end, indent)]
    for first, last in body:
        if any(line in keep for line in range(first, last + 1)):
            pieces += [(a, b, indent) for a, b in _kept(lines, first, last, keep)]
    if len(pieces) == 1:  # only the header holds one (`def f(on=is_sm100_supported()):`)
        pieces.append((*body[0], indent))
    return pieces


def _kept(
    lines: Sequence[str], first: int, last: int, keep: Collection[int]
) -> list[tuple[int, int]]:
    """A statement holding a `keep` line: whole, or for a long `if`, what `gates` reads of it.

    That is each clause's header, the first statement of each clause (what the branch does)
    and the statements holding a `keep` line, the nested `if`s among them likewise. An `else`
    that starts with an `if` keeps a second statement, so it stays no `elif`.
    """
    if last - first < _LONG_IF or not _IF.match(lines[first - 1]):
        return [(first, last)]
    indent = _indent(lines[first - 1])
    quoted = _inside_strings(lines, first, last)
    clauses = [first] + [
        number
        for number in range(first + 1, last + 1)
        if _indent(lines[number - 1]) == indent
        and _CLAUSE.match(lines[number - 1], indent or 0)
        and number not in quoted
    ]
    ranges = []
    for index, start in enumerate(clauses):
        stop = clauses[index + 1] - 1 if index + 1 < len(clauses) else last
        header_end = _header_end(lines, start, stop)
        body = _body_statements(lines, header_end + 1, stop) if header_end is not None else []
        if header_end is None or not body:
            return [(first, last)]
        ranges.append((start, header_end))
        firsts = (
            2
            if lines[start - 1].lstrip().startswith("else") and _IF.match(lines[body[0][0] - 1])
            else 1
        )
        for position, (a, b) in enumerate(body):
            if position < firsts:
                ranges.append((a, b))
            elif any(line in keep for line in range(a, b + 1)):
                ranges += _kept(lines, a, b, keep)
    return ranges


_HEADER = re.compile(r"\s*(?:(?:async\s+)?def|class)\s")
_IF = re.compile(r"\s*if\s")
_CLAUSE = re.compile(r"(?:elif\b|else\s*:)")
_LONG_IF = 12  # lines: a shorter `if` is parsed whole


def _header_end(lines: Sequence[str], start: int, end: int) -> int | None:
    """The last line of the signature starting at line `start`: brackets closed, then `:`.

    None when the body shares the header's line (`def f(): return 1`) or the signature holds
    something this cannot follow (a triple-quoted string)."""
    depth = 0
    for number in range(start, end + 1):
        line = lines[number - 1]
        if '"""' in line or "'''" in line:
            return None
        code = without_strings(line).split("#", 1)[0].rstrip()
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0 and code.endswith(":"):
            return number if number < end else None
    return None


def _body_statements(lines: Sequence[str], first: int, end: int) -> list[tuple[int, int]]:
    """(first, last line) of each statement at the body's own indentation; a decorator stays
    with the `def` or `class` it decorates."""
    indent = None
    starts: list[int] = []
    decorated = False
    quoted = _inside_strings(lines, first, end)
    for number in range(first, end + 1):
        text = lines[number - 1]
        stripped = text.lstrip()  # `_indent`, inline (as in `_end`)
        if not stripped or stripped[0] == "#" or number in quoted:
            continue
        level = len(text) - len(stripped)
        if indent is None:
            indent = level
        if level != indent or _CONTINUES.match(text, level):
            continue
        if not decorated:
            starts.append(number)
        decorated = text.startswith("@", level)
    return [
        (start, (starts[i + 1] - 1) if i + 1 < len(starts) else end)
        for i, start in enumerate(starts)
    ]


def _inside_strings(lines: Sequence[str], first: int, last: int) -> set[int]:
    """The lines after the first of a triple-quoted string (a docstring's prose, a code sample
    in it): no statement starts there, whatever it looks like."""
    inside: set[int] = set()
    quote = None
    for number in range(first, last + 1):
        text = lines[number - 1]
        if quote is not None:
            inside.add(number)
            if text.count(quote) % 2:
                quote = None
        elif '"""' in text or "'''" in text:
            for mark in ('"""', "'''"):
                if text.count(mark) % 2:
                    quote = mark
                    break
    return inside


def _dedent(text: str, indent: int) -> str:
    strip = min(indent, len(text) - len(text.lstrip()))
    return text[strip:]
