"""`python -m tests.crashing N -- ARGS`: run the sglpatch CLI and die (os._exit, as SIGKILL
would: no cleanup, no finally) at the Nth write step: journal, stage, ledger-commit or replace."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sglpatch import fsio
from sglpatch.cli import main

KILLED = 137


def _kill_at(nth: int) -> None:
    seen = 0

    def hook(step: str, path: Path) -> None:
        nonlocal seen
        seen += 1
        if seen == nth:
            os._exit(KILLED)

    fsio.fault_hook = hook


if __name__ == "__main__":
    _kill_at(int(sys.argv[1]))
    sys.argv = ["sglpatch", *sys.argv[3:]]  # argv[2] is "--"
    main()
