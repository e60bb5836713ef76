"""The human verdicts (docs/sm120-verdicts.json) and the table's rows they make with the hunks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from scripts.triage.diff import Hunk
from scripts.triage.errors import TriageError

VERDICT_TEXT = {
    "backported": "backported",
    "to-backport": "to backport (not yet)",
    "needs-kernel": "needs a kernel or wheel the old release lacks",
    "new-feature": "new feature",
    "not-a-fix": "not a capability-12 fix",
    # For the hunks of GATES (gates that include 12 without naming it):
    "gap": "a gap: 12 gets SM100-only code",
    "upstream-fix": "upstream fix of a gate that let 12 in (to backport)",
    "forward-fixed": "forward-fixed",
    "excluded": "not a gap: 12 excluded before and after",
    "runs-on-12": "not a gap: what 12 gets runs on 12",
    "other-platform": "AMD or another platform",
    "unreviewed": "unreviewed",
}
# Verdicts that name the sglpatch patch doing the work.
NEEDS_PATCH = {"backported", "forward-fixed"}


@dataclass
class Change:
    """One row: hunks a human grouped as one upstream change, with the verdict."""

    release: str
    verdict: str
    description: str
    patch: str = ""
    hunks: list[tuple[str, str]] = field(default_factory=list)  # (file, hunk id)


def _json_type(value: object) -> str:
    """What `value` is in JSON's words, with its article ("an object", "a list")."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def load_verdicts(path: Path) -> list[Change]:
    """The reviewed changes in `path`; TriageError naming the file and the change if malformed."""
    where = f"--verdicts {path}"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TriageError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise TriageError(f"{where} is a folder, not a JSON file") from None
    except OSError as error:
        raise TriageError(f"{where}: cannot read it: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TriageError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise TriageError(
            f"{where} is not JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    if not isinstance(rows, list):
        raise TriageError(f"{where} must hold a JSON list of changes, not {_json_type(rows)}")
    return [_change(row, f"{where}: change {n}") for n, row in enumerate(rows, 1)]


def _change(row: object, where: str) -> Change:
    if not isinstance(row, dict):
        raise TriageError(f"{where} must be a JSON object, not {_json_type(row)}")
    for key in ("release", "verdict", "description", "patch"):
        if key == "patch" and key not in row:
            continue
        if not isinstance(row.get(key), str):
            found = "missing" if key not in row else _json_type(row[key])
            raise TriageError(f"{where}: {key!r} must be a string, not {found}")
    try:
        Version(row["release"])
    except InvalidVersion:
        raise TriageError(f"{where}: 'release' {row['release']!r} is not a version") from None
    hunks = row.get("hunks")
    if not isinstance(hunks, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        for pair in hunks
    ):
        raise TriageError(f"{where}: 'hunks' must be a list of [file, hunk id] pairs")
    return Change(
        release=row["release"],
        verdict=row["verdict"],
        description=row["description"],
        patch=row.get("patch", ""),
        hunks=[(file, hunk) for file, hunk in hunks],
    )


def unknown_verdicts(changes: Iterable[Change]) -> list[str]:
    problems = []
    for change in changes:
        if change.verdict not in VERDICT_TEXT or change.verdict == "unreviewed":
            problems.append(f"{change.release} {change.description}: verdict {change.verdict!r}")
        if change.verdict in NEEDS_PATCH and not change.patch:
            problems.append(
                f"{change.release} {change.description}: {change.verdict} without patch"
            )
    return problems


def rows(hunks: Sequence[Hunk], changes: Sequence[Change]) -> list[Change]:
    """The table: reviewed changes that still match a hunk, then one row per unreviewed file."""
    by_key = {(c.release, file, hunk): c for c in changes for file, hunk in c.hunks}
    found: dict[int, Change] = {}
    unreviewed: dict[tuple[str, str], Change] = {}
    for hunk in hunks:
        change = by_key.get((hunk.release, hunk.file, hunk.id))
        if change is not None:
            row = found.setdefault(
                id(change), Change(change.release, change.verdict, change.description, change.patch)
            )
        else:
            sample = next((line for line in hunk.lines if line[0] == "+"), hunk.lines[0])
            row = unreviewed.setdefault(
                (hunk.release, hunk.file),
                Change(hunk.release, "unreviewed", f"`{sample[:70].replace('|', '/')}`"),
            )
        row.hunks.append((hunk.file, hunk.id))
    table = [*found.values(), *unreviewed.values()]
    return sorted(table, key=lambda c: (Version(c.release), c.hunks[0][0], c.hunks[0][1]))
