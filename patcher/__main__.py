"""`python -m sglpatch` and the `sglpatch` command."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from sglpatch.cli import main as run

        run()
    except KeyboardInterrupt:  # while the CLI itself imports, or as `run` ends
        from sglpatch.errors import ExitCode, forget_interrupt  # no typer, no libcst: quick

        sys.stderr.write("sglpatch: error: interrupted\n")
        forget_interrupt()
        sys.exit(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    main()
