"""The public capability-12 fixes list (docs/sm120-public-fixes.json): well-formed, every covered
row naming a catalogue patch, every catalogue patch named by a row, and its document current."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglpatch import catalogue
from tests.support import wheels

DATA = wheels.REPO / "docs" / "sm120-public-fixes.json"
SCRIPT = wheels.REPO / "scripts" / "public_fixes_doc.py"
# The key each status needs beyond source/what/releases/status; "release" may be null
# ("upstream, release not checked").
EXTRA = {
    "covered": "patch",
    "upstream": "release",
    "needs-kernel": "needs",
    "not-a-gap": "reason",
    "open": "reason",
}


def _rows() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = json.loads(DATA.read_text(encoding="utf-8"))
    return rows


ROWS = _rows()


def test_the_list_is_not_empty_and_has_every_status() -> None:
    assert len(ROWS) >= 40
    assert {row["status"] for row in ROWS} == set(EXTRA)


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}:{r['source'][:40]}" for i, r in enumerate(ROWS)])
def test_every_row_is_well_formed(row: dict[str, str]) -> None:
    status = row["status"]
    assert status in EXTRA, status
    assert set(row) == {"source", "what", "releases", "status", EXTRA[status]}, row
    for key in ("source", "what", "releases"):
        assert isinstance(row[key], str) and row[key].strip(), (key, row)
        assert "\n" not in row[key]
    try:
        SpecifierSet(row["releases"])
    except InvalidSpecifier as exc:
        pytest.fail(f"{row['source']}: releases {row['releases']!r} is not a PEP 440 range: {exc}")
    extra = row[EXTRA[status]]
    if status == "upstream":
        assert extra is None or Version(extra) >= Version("0.5.3"), row
    else:
        assert isinstance(extra, str) and extra.strip(), row


def test_every_covered_row_names_a_catalogue_patch() -> None:
    ids = {patch.id for patch in catalogue.load()}
    unknown = [row["patch"] for row in ROWS if row["status"] == "covered"]
    assert [patch for patch in unknown if patch not in ids] == []


def test_every_catalogue_patch_is_named_by_a_row() -> None:
    named = {row["patch"] for row in ROWS if row["status"] == "covered"}
    missing = sorted(patch.id for patch in catalogue.load() if patch.id not in named)
    assert missing == [], f"patches without a public-fix row in {DATA.name}: {missing}"


def test_no_source_is_listed_twice_for_the_same_status() -> None:
    keys = [(row["source"], row["status"], row.get("patch")) for row in ROWS]
    assert len(keys) == len(set(keys))


def test_the_document_is_up_to_date() -> None:
    # As the document's header says to run it: the file, from the repository's root.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        check=False,
        cwd=wheels.REPO,
    )
    assert result.returncode == 0, result.stderr
