from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sglpatch.diff import unified

lines = st.lists(
    st.sampled_from(["a\n", "b\n", "c\n", "x = 1\n", "\n", "# c\r\n", "\x0cform\n"]), max_size=40
)


@st.composite
def edits(draw: st.DrawFn) -> tuple[str, str]:
    old = draw(lines)
    new = list(old)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(new)))
        if new and draw(st.booleans()):
            del new[min(at, len(new) - 1)]
        else:
            new.insert(at, draw(st.sampled_from(["added\n", "12: [],\n", "    def f(self):\n"])))
    tail = draw(st.sampled_from(["", "end", "end\n"]))
    return "".join(old) + tail, "".join(new) + draw(st.sampled_from([tail, "other"]))


def _changed(diff: str) -> tuple[int, int]:
    body = [line for line in diff.splitlines() if not line.startswith(("---", "+++"))]
    return sum(line.startswith("+") for line in body), sum(line.startswith("-") for line in body)


def _split(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _common_ends(a: list[str], b: list[str]) -> tuple[int, int]:
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return head, tail


@settings(max_examples=300, deadline=None)
@given(edits())
def test_common_head_and_tail_are_never_changed(pair: tuple[str, str]) -> None:
    old, new = pair
    a, b = _split(old), _split(new)
    head, tail = _common_ends(a, b)
    plus, minus = _changed(unified("f.py", old.encode(), new.encode()))
    assert (plus + minus == 0) == (old == new)
    assert minus <= len(a) - head - tail and plus <= len(b) - head - tail


def test_an_insertion_is_only_added_lines() -> None:
    old = "".join(f"line {i}\n" for i in range(500))
    new = old.replace("line 250\n", "line 250\n    12: [],\n")
    diff = unified("f.py", old.encode(), new.encode())
    assert _changed(diff) == (1, 0)
    assert "@@ -249,6 +249,7 @@\n line 248\n" in diff  # as difflib and diff(1) number it


@settings(max_examples=150, deadline=None)
@given(edits())
def test_git_apply_reproduces_the_new_bytes(pair: tuple[str, str]) -> None:
    old, new = pair
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.py"
        path.write_bytes(old.encode())
        patch = unified("f.py", old.encode(), new.encode())
        if patch:
            subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=folder, check=True)
        assert path.read_bytes() == new.encode()
