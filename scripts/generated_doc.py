"""What the scripts that generate a Markdown document from a data file share: a table cell, and
the command line that writes the document or, with `--check`, says it is stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def cell(text: str) -> str:
    """`text` as one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def main(
    argv: list[str] | None, description: str, doc: Path, render: Callable[[], str], script: str
) -> int:
    """Write `doc` as `render()` makes it; with `--check`, exit 1 if it differs instead."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is stale")
    args = parser.parse_args(argv)
    text = render()
    shown = doc.relative_to(Path(script).resolve().parent.parent)
    if args.check:
        current = doc.read_text(encoding="utf-8") if doc.exists() else ""
        if current != text:
            print(f"{shown} is stale: run scripts/{Path(script).name}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(text, encoding="utf-8")
    print(f"wrote {shown}")
    return 0
