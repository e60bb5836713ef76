#!/usr/bin/env python3
"""List every upstream SGLang change that decides what compute capability 12 (SM120 / SM121) gets.

Diffs the Python sources of consecutive real SGLang wheels (0.5.3 -> 0.5.23 by default, read
with zipfile from $SGLPATCH_WHEEL_CACHE, a missing one fetched with `pip download --no-deps`),
keeps the change hunks whose added or removed lines mention capability 12 or are a gate that
lets 12 in without naming it (GATES: `is_blackwell*`, `is_sm100*` / `is_sm90*` next to SM100-only
code, `major >= 10` and the like, and the `elif` / `else` / body of such a gate), and writes one
Markdown table (docs/sm120-upstream.md). The verdicts are human judgements kept in
docs/sm120-verdicts.json, keyed by (release, file, hunk id); a hunk the file does not know (a
new release) appears as "unreviewed", so a re-run never loses an old verdict.

    .venv/bin/python scripts/sm120_triage.py              # regenerate docs/sm120-upstream.md
    .venv/bin/python scripts/sm120_triage.py --to 0.5.24  # a new release: review its rows
    .venv/bin/python scripts/sm120_triage.py --check      # exit 1 if the doc is stale/unreviewed
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from packaging.version import InvalidVersion, Version

from sglpatch.store.fsio import write_output  # as a shell's `>`, but whole

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    root = str(Path(__file__).resolve().parent.parent)  # found from any folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    os.execv(sys.executable, [sys.executable, "-m", "scripts.sm120_triage", *sys.argv[1:]])

from scripts.triage.branches import branch_conditions
from scripts.triage.diff import Hunk, collect, diff_releases
from scripts.triage.document import dump, render, stubs
from scripts.triage.errors import TriageError
from scripts.triage.patterns import gate_families, mentions_capability_12
from scripts.triage.verdicts import VERDICT_TEXT, Change, load_verdicts, rows, unknown_verdicts
from tests.support.releases import RELEASES  # the releases, named once

# What the tests reach through this module, besides `main`.
__all__ = [
    "VERDICT_TEXT",
    "Change",
    "Hunk",
    "branch_conditions",
    "collect",
    "diff_releases",
    "gate_families",
    "load_verdicts",
    "main",
    "mentions_capability_12",
    "rows",
    "stubs",
    "unknown_verdicts",
]

REPO = Path(__file__).resolve().parent.parent

PROG = "scripts/sm120_triage.py"
DOC = REPO / "docs" / "sm120-upstream.md"
VERDICTS = REPO / "docs" / "sm120-verdicts.json"
FIRST, LAST = "0.5.3", "0.5.23"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as sglpatch's own: `prog: error: ... (see prog --help)`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def release_name(value: str) -> str:
    """An argparse type: a published release, spelled as tests/support/releases.py spells it.

    Between the oldest and the newest release tests/support/releases.py lists every one, so a
    version in that span it lacks is no release; one past the newest is a new release, fetched
    with pip.
    """
    try:
        version = Version(value)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a release (a version such as {LAST})"
        ) from None
    if version.local is not None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a release: it has a local label")
    known = {Version(r): r for r in RELEASES}
    if version in known:
        return known[version]
    oldest, newest = min(known), max(known)
    if oldest < version < newest:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a release: tests/support/wheels.py lists every release from "
            f"{known[oldest]} to {known[newest]}"
        )
    return str(version)


def _check_out(out: Path, writing: bool) -> None:
    """Refuse an --out that cannot be written, before the wheels are read and diffed."""
    where = f"--out {out}"
    if out.is_dir():
        raise TriageError(f"{where} is a folder; give the Markdown file to write")
    if not writing:
        return
    folder = out.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise TriageError(f"{where}: {folder} {what}")
    try:  # the one sure test: make (and drop) the kind of temporary file the write will make
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as error:
        raise TriageError(f"{where}: cannot write in {folder}: {error.strerror}") from None
    os.close(handle)
    Path(probe).unlink()


def _parser() -> _Parser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument(
        "--from", dest="first", type=release_name, default=FIRST, help="oldest release"
    )
    parser.add_argument("--to", dest="last", type=release_name, default=LAST, help="newest release")
    parser.add_argument("--out", type=Path, default=DOC, help="the Markdown table to write")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS, help="the verdicts file")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    parser.add_argument("--dump", action="store_true", help="print every hunk's lines")
    parser.add_argument("--stubs", action="store_true", help="print JSON for unreviewed rows")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TriageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    # Every value is checked before the first wheel is read: nothing is written on a bad one.
    if Version(args.first) >= Version(args.last):
        raise TriageError(
            f"--from {args.first} is not older than --to {args.last}: "
            "the range selects no release to compare"
        )
    _check_out(args.out, writing=not (args.check or args.dump or args.stubs))
    changes = load_verdicts(args.verdicts)
    if problems := unknown_verdicts(changes):
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        shown = "; ".join(problems[:3]) + more
        raise TriageError(f"--verdicts {args.verdicts}: {len(problems)} problems: {shown}")
    hunks = collect(args.first, args.last)
    if args.dump:
        sys.stdout.write(dump(hunks))
        return 0
    table = rows(hunks, changes)
    if args.stubs:
        print(stubs(table))
        return 0
    text = render(table, hunks, args.first, args.last)
    unreviewed = sum(len(row.hunks) for row in table if row.verdict == "unreviewed")
    if args.check:
        try:
            stale = not args.out.exists() or args.out.read_bytes() != text.encode()
        except OSError as error:
            raise TriageError(f"--out {args.out}: cannot read it: {error.strerror}") from None
        if stale:
            print(f"{args.out} is not what the script generates", file=sys.stderr)
        if unreviewed:
            print(f"{unreviewed} hunks have no verdict", file=sys.stderr)
        return 1 if stale or unreviewed else 0
    try:
        write_output(args.out, text.encode())
    except OSError as error:
        raise TriageError(f"--out {args.out}: cannot write it: {error.strerror}", code=1) from None
    print(f"{args.out}: {len(table)} rows, {len(hunks)} hunks, {unreviewed} unreviewed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
