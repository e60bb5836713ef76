"""`python -m sglpatch` and the `sglpatch` command."""

from __future__ import annotations

import sys


def main() -> None:
    from sglpatch import warmup

    warmup.start(sys.argv[1:])  # doctor's codemods load while the CLI does
    try:
        from sglpatch.cli import main as run
    except KeyboardInterrupt:  # Ctrl-C while the CLI itself is still importing
        from sglpatch.errors import forget_interrupt

        sys.stderr.write("sglpatch: error: interrupted\n")
        forget_interrupt()
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
