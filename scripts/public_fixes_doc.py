#!/usr/bin/env python3
"""Write docs/sm120-public-fixes.md from the public-fixes list (docs/sm120-public-fixes.json).

One row per public fix, crash report or patch set for capability 12 (12.0: RTX PRO 6000,
RTX 5090; 12.1: GB10): its source, what it is about, the SGLang releases it concerns, and where
it stands: covered by a catalogue patch, upstream in a release, needing a kernel or wheel, not a
gap, or open. tests/test_public_fixes.py checks the list against the catalogue.

    .venv/bin/python scripts/public_fixes_doc.py          # regenerate docs/sm120-public-fixes.md
    .venv/bin/python scripts/public_fixes_doc.py --check  # exit 1 if the document is stale
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    root = str(Path(__file__).resolve().parent.parent)  # found from any folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    os.execv(sys.executable, [sys.executable, "-m", "scripts.public_fixes_doc", *sys.argv[1:]])

from scripts.generated_doc import cell
from scripts.generated_doc import main as write_or_check

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "sm120-public-fixes.json"
DOC = REPO / "docs" / "sm120-public-fixes.md"
STATUSES = ("covered", "upstream", "needs-kernel", "not-a-gap", "open")
# An issue or pull request (GitHub redirects /issues/N to /pull/N), or a file at a commit.
_THREAD = re.compile(r"^([\w.-]+/[\w.-]+)#(\d+)$")
_FILE = re.compile(r"^([\w.-]+/[\w.-]+)/(\S+)@([0-9a-f]{40})$")

HEADER = """\
# Public capability-12 fixes and reports, and where each stands

Generated from `docs/sm120-public-fixes.json` by `scripts/public_fixes_doc.py`; do not edit by
hand (a test checks the two agree, that every `covered` row names a catalogue patch and that
every catalogue patch is named by a row). One row per public source: an SGLang, FlashInfer,
DeepGEMM or Triton issue or pull request, a public SM120/SM121 patch set, or, where no public
thread names the bug, the release tree a patch docstring cites. "releases" is the PEP 440 range
of SGLang releases the row concerns. Status:

- **covered by** a patch: `sglpatch apply` fixes it on those releases (`sglpatch list`);
- **upstream in** a release: SGLang fixed it there ("release not checked" when no patch
  docstring or `docs/sm120-upstream.md` names the release);
- **needs a kernel or wheel**: no selection change makes it run; what is missing is named;
- **not a gap**: with the reason;
- **open**: a gap or a report sglpatch does not fix or has not established, with the reason.

A row whose source a patch docstring (or a document under `docs/`) cites rests on that citation;
the others were read from stored copies of their threads and files (2026-12). None was re-run
on a GPU for this list.
"""


def load() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = json.loads(DATA.read_text(encoding="utf-8"))
    return rows


def status_text(row: dict[str, str]) -> str:
    status = row["status"]
    if status == "covered":
        return f"covered by `{row['patch']}`"
    if status == "upstream":
        release = row.get("release")
        return f"upstream in {release}" if release else "upstream, release not checked"
    if status == "needs-kernel":
        return f"needs a kernel or wheel: {row['needs']}"
    if status == "not-a-gap":
        return f"not a gap: {row['reason']}"
    return f"open: {row['reason']}"


def source_text(source: str) -> str:
    if match := _THREAD.match(source):
        repo, number = match.groups()
        return f"[{source}](https://github.com/{repo}/issues/{number})"
    if match := _FILE.match(source):
        repo, path, commit = match.groups()
        return f"[{repo} `{path}`@{commit[:10]}](https://github.com/{repo}/blob/{commit}/{path})"
    return source


def render() -> str:
    rows = load()
    counts = Counter(row["status"] for row in rows)
    lines = [HEADER, "| status | rows |", "|---|---|"]
    lines += [f"| {status} | {counts[status]} |" for status in STATUSES]
    lines += [f"| all | {len(rows)} |", ""]
    lines += ["| source | what | releases | status |", "|---|---|---|---|"]
    for row in rows:
        cells = [source_text(row["source"]), row["what"], f"`{row['releases']}`", status_text(row)]
        lines.append("| " + " | ".join(cell(text) for text in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, __doc__.splitlines()[0], DOC, render, __file__)


if __name__ == "__main__":
    sys.exit(main())
