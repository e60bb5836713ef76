#!/usr/bin/env python3
"""A census at capability 12 of each release's own backend choices (issue #19 point 2).

For every model architecture a release registers (EntryClass in sglang/srt/models/*.py, draft
models left out) and its usual quantizations, runs the release's own default-flag ServerArgs
resolution (tests/support/census.py: `_handle_model_specific_adjustments`, the attention
default, `_handle_moe_kernel_config`, or their 0.5.19+ hooks and override passes) on stand-in
devices of capability 12.0, 12.1 and 10.0, and judges each backend 12 gets with the
kernel-support table (`sglpatch.doctor.facts.kernel_support.runs_on`). One row per gap, grouped,
with a verdict: a catalogue patch that changes the decision (the decision is run again on the
patched source), or "needs a kernel or wheel", or "not a gap" with why.

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

from scripts.census.cells import run
from scripts.census.document import document
from scripts.census.gaps import gaps

# What the tests reach through this module, besides `main`, `OUT` and `_quiet`.
__all__ = ["gaps", "main", "run"]

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
    cells = [cell for release in releases for cell in run(release)]
    text = document(releases, cells)
    if options.check:
        current = options.out.read_text() if options.out.exists() else ""
        if current != text:
            print(f"{options.out} is stale: run scripts/sm120_census.py", file=sys.stderr)
            return 1
        return 0
    options.out.write_text(text)
    print(f"wrote {options.out} ({len(cells)} evaluations, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
