"""Golden fixtures, black-style: fixtures/<patch module>/<case>/before.py (and after.py).

The first line of before.py says `release=` (which release's code it is shaped like) and
`expect=` one of applied, upstream, failed, not-applicable.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

from sglpatch import catalogue, engine
from sglpatch.results import AlreadyApplied, Applied, Failed

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(FIXTURES.glob("*/*/before.py"))
PATCHES = {type(p).__module__.rsplit(".", 1)[1]: p for p in catalogue.load()}


def header(before: Path) -> tuple[Version, str]:
    first = before.read_text(encoding="utf-8").splitlines()[0]
    fields = dict(re.findall(r"(\w+)=(\S+)", first))
    return Version(fields["release"]), fields["expect"]


@pytest.mark.parametrize("before", CASES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_golden(before: Path) -> None:
    patch = PATCHES[before.parent.parent.name]
    release, expect = header(before)
    after = before.with_name("after.py")
    assert after.exists() == (expect == "applied")
    if expect == "not-applicable":
        assert patch.target_file(release) is None
        plan = engine.plan(_nowhere(), [patch], release)
        assert plan.outcomes[0].state == "not for this release" and not plan.changes
        return

    change, outcomes = engine.transform_source(before.read_bytes(), "f.py", [patch], release)
    outcome = outcomes[patch.id]
    if expect == "applied":
        assert isinstance(outcome, Applied)
        assert change is not None and change.after == after.read_bytes()
        # after -> after: nothing changes, and it is recognised as ours when the ledger says so
        again, second = engine.transform_source(
            after.read_bytes(), "f.py", [patch], release, [patch.id]
        )
        assert again is None
        assert isinstance(second[patch.id], AlreadyApplied) and second[patch.id].by == "sglpatch"
    elif expect == "upstream":
        assert change is None
        assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream"
    elif expect == "failed":
        assert change is None and isinstance(outcome, Failed)
    else:
        pytest.fail(f"unknown expectation {expect!r}")


def test_every_patch_has_golden_cases() -> None:
    covered = {p.parent.parent.name for p in CASES}
    assert covered == set(PATCHES)
    for name in PATCHES:
        kinds = {header(p)[1] for p in CASES if p.parent.parent.name == name}
        assert {"applied", "failed"} <= kinds, name


def _nowhere() -> engine.Target:
    from sglpatch.target import Layout, Target

    return Target(Path("/nonexistent"), Layout.SITE_PACKAGES, None, None)
