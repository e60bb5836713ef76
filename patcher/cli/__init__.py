"""The `sglpatch` command: parse, call `sglpatch.api`, print, exit with a documented code.

One module per command (`apply`, `revert`, `status` with `log`, `catalogue` for `list` and
`export`, `doctor`), each adding itself to the Typer `app`; shared options in `options`, rows,
colour and diffs in `output`, and the one error handler in `errors`.
"""

from __future__ import annotations

import atexit
import sys

from sglpatch.cli import apply, catalogue, doctor, revert, status  # noqa: F401 - they register
from sglpatch.cli.app import app, app_commands
from sglpatch.cli.errors import say_error
from sglpatch.errors import ExitCode, forget_interrupt

__all__ = ["app", "app_commands", "main"]

# The order `sglpatch --help` lists them in: what a user does first, first.
ORDER = ("apply", "revert", "status", "log", "list", "export", "doctor")
app.registered_commands.sort(
    key=lambda c: ORDER.index(c.name or getattr(c.callback, "__name__", "").rstrip("_"))
)


def main() -> None:
    atexit.register(doctor.freeze_if_ran)  # this process ends when the command does
    try:
        app()
    except KeyboardInterrupt:  # before or after a command's own handler (typer building it)
        say_error("interrupted")
        forget_interrupt()
        sys.exit(ExitCode.INTERRUPTED)
