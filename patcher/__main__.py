from __future__ import annotations

import sys

try:
    from sglpatch.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI itself is still importing
    sys.stderr.write("sglpatch: error: interrupted\n")
    eval("None")  # see cli._exit_interrupted: otherwise CPython ends the process by SIGINT
    sys.exit(130)

if __name__ == "__main__":
    main()
