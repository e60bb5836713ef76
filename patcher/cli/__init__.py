"""The `sglpatch` command: parse, call `sglpatch.api`, print, exit with a documented code.

One module per command (`apply`, `revert`, `status` with `log`, `catalogue` for `list` and
`export`, `doctor`), each adding itself to the Typer `app`; shared options in `options`, rows,
colour and diffs in `output`, and the one error handler in `errors`.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
from typing import NoReturn

from sglpatch.cli import apply, catalogue, doctor, revert, status  # noqa: F401 - they register
from sglpatch.cli.app import app, app_commands
from sglpatch.cli.errors import keep_unraisable_interrupts, say_error
from sglpatch.errors import ExitCode, forget_interrupt

__all__ = ["app", "app_commands", "main"]

# The order `sglpatch --help` lists them in: what a user does first, first.
ORDER = ("apply", "revert", "status", "log", "list", "export", "doctor")
app.registered_commands.sort(
    key=lambda c: ORDER.index(c.name or getattr(c.callback, "__name__", "").rstrip("_"))
)


def main() -> NoReturn:
    """Run the command line as this process, which ends with the command's exit code."""
    atexit.register(doctor.freeze_if_ran)  # this process ends when the command does
    kept = keep_unraisable_interrupts()
    code: str | int | None = ExitCode.OK
    try:
        try:
            app()
        finally:
            _ignore_ctrl_c()
    except KeyboardInterrupt:  # before or after a command's own handler (typer building it)
        say_error("interrupted")
        code = ExitCode.INTERRUPTED
    except SystemExit as done:
        code = done.code
    if kept and code != ExitCode.INTERRUPTED:  # a Ctrl-C Python could only print: still one
        say_error("interrupted")
        code = ExitCode.INTERRUPTED
    forget_interrupt()
    sys.exit(code)


def _ignore_ctrl_c() -> None:
    """The command has answered: a Ctrl-C now would only spoil how the process ends (a
    traceback from an atexit callback, death by SIGINT instead of the exit code)."""
    with contextlib.suppress(ValueError):  # not the main thread: not this process's entry
        signal.signal(signal.SIGINT, signal.SIG_IGN)
