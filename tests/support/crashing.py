"""`python -m tests.support.crashing WHEN -- ARGS`: run the sglpatch CLI and be killed mid-write.

WHEN is `N`: die (os._exit, as SIGKILL would: no cleanup, no finally) at the Nth write step
(journal, stage, ledger-commit or replace); or `SIG@N+DELAY`: at the Nth write step, start a
timer that sends signal SIG to this process DELAY seconds later, wherever the run is by then
(inside git, between two renames...).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from sglpatch.cli import main
from sglpatch.store import fsio

KILLED = 137


def _kill_at(nth: int) -> None:
    seen = 0

    def hook(step: str, path: Path) -> None:
        nonlocal seen
        seen += 1
        if seen == nth:
            os._exit(KILLED)

    fsio.fault_hook = hook


def _signal_after(signum: int, nth: int, delay: float) -> None:
    seen = 0

    def hook(step: str, path: Path) -> None:
        nonlocal seen
        seen += 1
        if seen == nth:
            timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()

    fsio.fault_hook = hook


if __name__ == "__main__":
    when = sys.argv[1]
    if "@" in when:
        signum, rest = when.split("@")
        nth, delay = rest.split("+")
        _signal_after(int(signum), int(nth), float(delay))
    else:
        _kill_at(int(when))
    sys.argv = ["sglpatch", *sys.argv[3:]]  # argv[2] is "--"
    main()
