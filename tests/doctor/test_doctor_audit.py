"""The hand audit of doctor's suspects (`docs/doctor-audit.md`, issues #20 and #33) pinned to what
doctor reports: on 0.5.7, 0.5.9, 0.5.16, 0.5.21 and 0.5.23 its suspects are exactly the audited
rows (file, line and deciding code), and the document's counts and percentages are computed from
its rows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglpatch.doctor.report import Suspect
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

AUDIT = Path(__file__).resolve().parents[2] / "docs" / "doctor-audit.md"
# 0.5.16 and 0.5.21: the two releases audited anew for issue #33 (not 0.5.9 or 0.5.23).
RELEASES = ("0.5.7", "0.5.9", "0.5.16", "0.5.21", "0.5.23")
VERDICTS = ("REAL", "harmless", "unsure")
BAR = 80.0  # issue #20: at least 80% of reported suspects are real

# A table row's first cell: `path:line` `code` (the path below sglang/).
_PLACE = re.compile(r"^`(?P<file>[^`:]+):(?P<line>\d+)` `(?P<code>.+)`$")
Row = tuple[str, int, str]  # (file, line, normalised code)


def _code(text: str) -> str:
    return " ".join(text.split())


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _sections(text: str) -> dict[str, list[str]]:
    """The document's `## <title>` sections, as their lines."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return found


def audited(text: str) -> dict[str, dict[Row, str]]:
    """Each release's audited suspects -> verdict."""
    sections = _sections(text)
    result: dict[str, dict[Row, str]] = {}
    for release in RELEASES:
        rows: dict[Row, str] = {}
        for line in sections[release]:
            if not line.startswith("| `"):
                continue
            cells = _cells(line)
            place = _PLACE.match(cells[0])
            assert place, f"{release}: a row's first cell is not `file:line` `code`: {cells[0]}"
            assert cells[2] in VERDICTS, f"{release}: {cells[0]}: verdict {cells[2]!r}"
            assert cells[3], f"{release}: {cells[0]}: no reason"
            key = (f"sglang/{place['file']}", int(place["line"]), _code(place["code"]))
            assert key not in rows, f"{release}: {cells[0]} audited twice"
            rows[key] = cells[2]
        result[release] = rows
    return result


def counts(text: str) -> dict[str, list[str]]:
    """The Counts table: release (or "overall") -> its cells after the first."""
    table = {}
    for line in _sections(text)["Counts"]:
        cells = _cells(line)
        if line.startswith("|") and cells[0] in (*RELEASES, "overall"):
            table[cells[0]] = cells[1:]
    return table


def _percent(real: int, reported: int) -> str:
    return f"{100 * real / reported:.1f}%"


_COVERED = re.compile(r"\(covered: (?P<patch>[a-z0-9-]+)\)")


def covered(text: str) -> dict[str, dict[Row, str | None]]:
    """Each release's audited suspects -> the patch its "doctor says" cell names as covering it."""
    sections = _sections(text)
    found: dict[str, dict[Row, str | None]] = {}
    for release in RELEASES:
        rows: dict[Row, str | None] = {}
        for line in sections[release]:
            if line.startswith("| `"):
                cells = _cells(line)
                place = _PLACE.match(cells[0])
                assert place
                said = _COVERED.search(cells[1])
                key = (f"sglang/{place['file']}", int(place["line"]), _code(place["code"]))
                rows[key] = said["patch"] if said else None
        found[release] = rows
    return found


@pytest.fixture(scope="module")
def suspects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[Row, Suspect]]:
    """What doctor lists as suspects on each release, in process, once each."""
    from sglpatch import api

    folder = tmp_path_factory.mktemp("audit-trees")
    found = {}
    for release in RELEASES:
        site = wheels.full_tree(release, folder / release)
        diagnosis = api.diagnose(site).diagnosis
        found[release] = {
            (s.finding.file, s.finding.line, _code(s.finding.code)): s for s in diagnosis.suspects
        }
    return found


@pytest.fixture(scope="module")
def reported(suspects: dict[str, dict[Row, Suspect]]) -> dict[str, dict[Row, str | None]]:
    """Each release's suspects -> covered_by."""
    return {r: {row: s.covered_by for row, s in found.items()} for r, found in suspects.items()}


_OPT_IN = re.compile(r"opt-in: `(?P<flag>[^`]+)`")


@pytest.mark.parametrize("release", RELEASES)
def test_by_default_and_opt_in_are_what_the_audit_says_doctor_says(
    suspects: dict[str, dict[Row, Suspect]], release: str
) -> None:
    """A "doctor says" cell naming an opt-in flag in backquotes is doctor's flag; "by default"
    is no flag (0.5.7:1066, 0.5.23:716: the KV dtype 12 is given for `auto`)."""
    checked = 0
    for line in _sections(AUDIT.read_text())[release]:
        if not line.startswith("| `"):
            continue
        cells = _cells(line)
        place = _PLACE.match(cells[0])
        assert place
        suspect = suspects[release][
            (f"sglang/{place['file']}", int(place["line"]), _code(place["code"]))
        ]
        flag = _OPT_IN.search(cells[1])
        if flag:
            assert suspect.opt_in == flag["flag"], cells[0]
        elif "by default" in cells[1]:
            assert suspect.opt_in == "", cells[0]
        else:
            continue
        checked += 1
    assert checked, f"{release}: no row says how doctor labels it"


@pytest.mark.parametrize("release", RELEASES)
def test_doctor_reports_exactly_the_audited_suspects(
    reported: dict[str, dict[Row, str | None]], release: str
) -> None:
    rows = set(audited(AUDIT.read_text())[release])
    got = set(reported[release])
    assert got == rows, (
        f"doctor's suspects on {release} changed: audit {sorted(got - rows)} in "
        f"docs/doctor-audit.md; no longer reported: {sorted(rows - got)}"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_covered_by_is_what_the_audit_says_doctor_says(
    reported: dict[str, dict[Row, str | None]], release: str
) -> None:
    """The audit's reasons say where covered_by is right or wrong: the cell must be doctor's."""
    assert reported[release] == covered(AUDIT.read_text())[release]


def test_the_counts_are_the_rows() -> None:
    text = AUDIT.read_text()
    rows, table = audited(text), counts(text)
    totals = dict.fromkeys(VERDICTS, 0)
    for release in RELEASES:
        verdicts = list(rows[release].values())
        tally = [verdicts.count(v) for v in VERDICTS]
        for verdict, n in zip(VERDICTS, tally, strict=True):
            totals[verdict] += n
        expected = [str(len(verdicts)), *map(str, tally), _percent(tally[0], len(verdicts))]
        assert table[release] == expected, release
    every = sum(totals.values())
    overall = [str(every), *(str(totals[v]) for v in VERDICTS), _percent(totals["REAL"], every)]
    assert table["overall"] == overall


def test_the_parser_sees_a_changed_row() -> None:
    """The checks above read the document, not a constant: a verdict or a place edited changes
    what they see."""
    text = AUDIT.read_text()
    first = next(line for line in _sections(text)[SEED] if line.startswith("| `"))
    cells = _cells(first)
    flipped = first.replace(f"| {cells[2]} |", "| unsure |" if cells[2] != "unsure" else "| REAL |")
    assert audited(text.replace(first, flipped))[SEED] != audited(text)[SEED]
    moved = first.replace(cells[0], cells[0].replace(":3`", ":4`", 1))
    assert set(audited(text.replace(first, moved))[SEED]) != set(audited(text)[SEED])


def test_at_least_80_percent_of_the_suspects_are_real() -> None:
    table = counts(AUDIT.read_text())
    for row in (*RELEASES, "overall"):
        assert float(table[row][-1].rstrip("%")) >= BAR, row
