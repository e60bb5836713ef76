#!/usr/bin/env python3
"""A census at capability 12: which models run on 12.0 and 12.1, per release (issue #33).

For every release listed, its wheel is extracted and `sglpatch doctor --all-models` is run on it
for both parts (scripts/census/cells.py); the rows are written as docs/sm120-census.md
(scripts/census/document.py). The document is doctor's own answer, not a second evaluator.

    .venv/bin/python scripts/sm120_census.py                 # regenerate docs/sm120-census.md
    .venv/bin/python scripts/sm120_census.py --check         # exit 1 if the document is stale
    .venv/bin/python scripts/sm120_census.py --releases 0.5.9 --out /tmp/census.md
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    root = str(Path(__file__).resolve().parent.parent)  # found from any folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    os.execv(sys.executable, [sys.executable, "-m", "scripts.sm120_census", *sys.argv[1:]])

from scripts.census.cells import rows
from scripts.census.document import document, section

# What the tests reach through this module, besides `main`, `OUT` and `_quiet`.
__all__ = ["document", "main", "rows", "section"]

REPO = Path(__file__).resolve().parent.parent

RELEASES = ["0.5.9", "0.5.16", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
OUT = REPO / "docs" / "sm120-census.md"


def _quiet() -> None:
    sglang = logging.getLogger("sglang")
    sglang.setLevel(logging.CRITICAL)
    sglang.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES), help="comma-separated")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is stale")
    options = parser.parse_args(argv)
    _quiet()
    releases = [r.strip() for r in options.releases.split(",") if r.strip()]
    started = time.monotonic()
    found = {release: rows(release) for release in releases}
    text = document(releases, found)
    if options.check:
        current = options.out.read_text() if options.out.exists() else ""
        if current != text:
            print(f"{options.out} is stale: run scripts/sm120_census.py", file=sys.stderr)
            return 1
        return 0
    options.out.write_text(text)
    count = sum(len(r) for r in found.values())
    print(f"wrote {options.out} ({count} rows, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
