"""`Patch.reads` holds on every release: a patch that declares what it reads gives the same
outcomes and the same bytes whether its file is parsed in part (`sglpatch.elision`) or whole.

Each is run alone (as doctor runs it), with the other patches of its file (as apply runs them),
and again over its own output (an applied tree, where it must find its change present).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from packaging.version import Version

from sglpatch import catalogue, engine
from sglpatch.patch import Patch
from tests.support import wheels

pytestmark = pytest.mark.wheel

PATCHES = catalogue.load()


def _groups(release: Version) -> dict[str, list[list[Patch]]]:
    """file -> the runs to compare on it: every patch alone, and all of them together."""
    on_file: dict[str, list[Patch]] = {}
    for patch in PATCHES:
        path = patch.package_file(release)
        if path is not None:
            on_file.setdefault(path, []).append(patch)
    return {
        path: [[p] for p in patches] + ([patches] if len(patches) > 1 else [])
        for path, patches in on_file.items()
    }


def _both_ways(
    source: bytes, path: str, patches: Sequence[Patch], release: Version
) -> tuple[bytes | None, object]:
    """The part's run and the whole file's must agree; the part's result."""
    parsed = engine.parse_for(source, patches, release)
    assert isinstance(parsed, engine.Parsed) and parsed.cut is not None, "no part was parsed"
    whole = engine.parse(source)
    assert not isinstance(whole, str)
    expected, expected_outcomes = engine.transform_module(whole, source, path, patches, release)
    change, outcomes = engine.transform_source(source, path, patches, release)
    assert outcomes == expected_outcomes
    assert (change and change.after) == (expected and expected.after)
    for patch in patches:  # doctor's way: one patch at a time over one parse
        outcome, after, _ = engine.run_alone(parsed, path, patch, release)
        alone, alone_outcomes = (
            (expected, expected_outcomes)
            if len(patches) == 1
            else engine.transform_module(whole, source, path, [patch], release)
        )
        assert outcome == alone_outcomes[patch.id]
        assert after == (alone and alone.after)
    return (change.after if change else None), outcomes


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_a_part_answers_as_the_whole_file_does(release: str) -> None:
    version = Version(release)
    compared = 0
    for path, runs in _groups(version).items():
        member = f"sglang/{path}"
        if member not in wheels.members(release):
            continue
        source = wheels.member(release, member)
        for patches in runs:
            if any(p.reads_on(version) is None for p in patches):
                continue
            after, _ = _both_ways(source, path, patches, version)
            if after is not None:
                _both_ways(after, path, patches, version)  # the applied tree
            compared += 1
    declared = [p for p in PATCHES if p.reads_on(version) is not None and p.package_file(version)]
    assert compared >= len(declared)
