"""How the tests run the maintainer's scripts (scripts/sm120_triage.py, bench/run) and what a
refusal must look like: one line, `<prog>: error: ...`, an exit code, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support import wheels


def run_script(
    script: Path, args: Sequence[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`script` run with this Python from the repository's root, as the maintainers run it."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        cwd=wheels.REPO,  # the scripts run from the repository's root (scripts/__init__.py)
        check=False,
    )


def assert_refused(
    done: subprocess.CompletedProcess[str], prog: str, code: int, *words: str
) -> None:
    """One line on stderr, `<prog>: error: ...`, holding `words`; the exit code; no traceback.

    A wheel download's progress line (`tests: downloading ...`) is no error, and not counted.
    """
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("tests: download")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
