"""doctor's text reads that skip a `^`-led multiline regex find what that regex finds.

A multiline `^` is tried at every offset of a text; the scanner's `is_...` definitions and the
census's class members are found by patterns led by a literal instead (`def`, the `\\n` before
a line). Each is checked here against the `^`-led pattern it stands for, on edge cases and on
the real models and scanned modules of a release.
"""

from __future__ import annotations

import re

import pytest

from sglpatch.doctor import census
from sglpatch.doctor.gates import scanner
from tests.support import releases, wheels

_DEFINED = re.compile(r"^\s*def\s+(is_\w+)", re.MULTILINE)

_DEFINITIONS = [
    "def is_a(): pass",
    "  def  is_b():\n",
    "x def is_c(): pass\n",  # not at a line's start
    "undef is_d\n",
    "\n\n\t def\n is_e(): pass\n",  # the name on the next line
    "a\u00a0def is_f(): pass\n",
    "\u00a0def is_g(): pass\n",  # Unicode whitespace leads to it
    "\u2028def is_h(): pass\n",
    "def is_x(): pass; def is_y(): pass\n",
    "\r\ndef is_z(): pass\n",
    "q\rdef is_w(): pass\n",  # a lone CR starts no line
    "def\u3000is_v(): pass\n",
    "class A:\n    def is_sm100(self):\n        return False\n",
]


@pytest.mark.parametrize("text", _DEFINITIONS)
def test_defined_names_are_those_of_the_multiline_pattern(text: str) -> None:
    assert scanner._defined(text) == frozenset(_DEFINED.findall(text))


def _reference_class(text: str, start: int, end: int) -> tuple[frozenset[str], frozenset[str]]:
    """What `census._Summary._class` read with `^`-led multiline patterns."""
    body = text[start:end]
    indent = re.search(r"\n([ \t]+)[^\s#]", body)
    if indent is None:
        return frozenset(), frozenset()
    at = re.escape(indent.group(1))
    member = re.compile(rf"^{at}(?:(?:async\s+)?def\s+(\w+)|(\w+)\s*(?::[^=\n]*)?=(?!=))", re.M)
    init = re.compile(rf"^{at}def __init__\b", re.M)
    after_member = re.compile(rf"^{at}(?=[^\s#)\]}}])", re.M)
    members = frozenset(a or b for a, b in member.findall(body))
    attributes: set[str] = set()
    for header in init.finditer(body):
        after = after_member.search(body, header.end())
        stop = after.start() if after else len(body)
        attributes.update(
            re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", body[:stop][header.end() :])
        )
    return members, frozenset(attributes)


_CLASSES = [
    "class A:    x = 1\n",  # a member on the header's line
    "class A:  \n  def f(self):\n    self.a = 1\n  b = 2\n",
    "class A:\n\tdef __init__(self):\n\t\tself.q: int = 3\n\tz=1\n",
    "class A: pass\n",
    "class A:\n    def __init__(self): self.k = 1\n    x\n    = 2\n",
    "class A(B):\n    async def go(self): ...\n    n: int\n    m: int = 0\n    def __init__(s):\n"
    "        self.p = 1\n        self.r == 2\n    # self.no = 3\n    def g(self):\n"
    "        self.later = 4\n",
]


def _same_classes(text: str) -> int:
    summary = census._Summary(text, "m")
    for name, (_, start) in summary.classes.items():
        after = re.compile(r"\n(?=[^\s#)\]}])").search(text, start)
        end = after.start() if after else len(text)
        assert summary._class(name) == _reference_class(text, start, end), name
    return len(summary.classes)


@pytest.mark.parametrize("text", _CLASSES)
def test_class_members_are_those_of_the_multiline_patterns(text: str) -> None:
    assert _same_classes(text) >= 1


@pytest.mark.wheel
def test_the_real_models_and_modules_read_the_same() -> None:
    release = releases.NEWEST
    names = [n for n in wheels.members(release) if n.endswith(".py")]
    classes = 0
    for name in names:
        text = wheels.member(release, name).decode("utf-8", errors="replace")
        if name.startswith("sglang/srt/models/"):
            classes += _same_classes(text)
        if "def is_" in text:
            assert scanner._defined(text) == frozenset(_DEFINED.findall(text)), name
    assert classes > 1000
