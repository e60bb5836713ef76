"""Unified diffs that `git apply` and `patch -p1` accept at the target root."""

from __future__ import annotations

import difflib

NO_NEWLINE = "\\ No newline at end of file\n"


def unified(path: str, before: bytes, after: bytes, context: int = 3) -> str:
    """A git-style diff of one file (`a/` and `b/` prefixes), byte-faithful for UTF-8 text."""
    old = before.decode("utf-8").splitlines(keepends=True)
    new = after.decode("utf-8").splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=context, lineterm="\n")
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:  # the file's last line has no newline: say so, as diff(1) does
            out.append(line + "\n" + NO_NEWLINE)
    return "".join(out) if len(out) > 1 else ""
