"""`python -m sglpatch` and the `sglpatch` command."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from sglpatch.cli import main as run
    except KeyboardInterrupt:  # Ctrl-C while the CLI itself is still importing
        sys.stderr.write("sglpatch: error: interrupted\n")
        eval("None")  # see cli._exit_interrupted: otherwise CPython ends the process by SIGINT
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
