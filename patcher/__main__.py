from __future__ import annotations

from sglpatch.cli import main

if __name__ == "__main__":
    main()
