"""The catalogue against the target, in memory: which patches still have work, and what each
one's change does to the scanner's findings.

A patch has work when its target file exists for the release, upstream has not fixed it, and
its codemod would still change the file (the engine says `Applied`, not `AlreadyApplied`). Each
such patch is run on its own over the file's current bytes and the result is scanned again: a
finding that disappears, or whose branch for capability 12 changes, is covered by that patch.
Touching the same file is not enough; the patch has to change what 12 gets at that gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from sglpatch.doctor.findings import Finding
from sglpatch.patch import Patch
from sglpatch.results import Applied, Failed, Outcome


class PatchCheck(NamedTuple):
    patch: Patch
    file: str  # sglang/...
    outcome: Outcome
    after: bytes | None  # the file with this patch alone applied, when it has work


def check(package_dir: Path, release: Version, patches: Sequence[Patch]) -> list[PatchCheck]:
    """Every catalogue patch that is meant for this release, with its in-memory outcome."""
    from sglpatch import engine  # and libcst: not loaded when sglpatch.warmup answers

    checks = []
    for patch in patches:
        relative = patch.package_file(release)
        if relative is None or patch.fixed_upstream(release):
            continue
        shown = f"sglang/{relative}"
        path = package_dir / relative
        try:
            before = path.read_bytes()
        except OSError:
            continue  # the release lacks the module (an optional part not installed)
        change, outcomes = engine.transform_source(before, shown, [patch], release)
        outcome = outcomes[patch.id]
        checks.append(PatchCheck(patch, shown, outcome, change.after if change else None))
    return checks


def pending(checks: Sequence[PatchCheck]) -> list[PatchCheck]:
    """The patches that would change something, or that cannot apply (both leave work to do)."""
    return [c for c in checks if isinstance(c.outcome, (Applied, Failed))]


def covered_by(
    findings: Sequence[Finding],
    checks: Sequence[PatchCheck],
    rescan: Callable[[bytes, str], Sequence[Finding]],
) -> dict[Finding, str]:
    """finding -> the first patch (by id) whose change removes it or changes what 12 gets."""
    by_file: Mapping[str, list[Finding]] = _group(findings)
    covered: dict[Finding, str] = {}
    for check_ in sorted(checks, key=lambda c: c.patch.id):
        if check_.after is None or check_.file not in by_file:
            continue
        remaining = _multiset(f.key for f in rescan(check_.after, check_.file))
        for finding in by_file[check_.file]:
            if remaining.get(finding.key, 0) > 0:
                remaining[finding.key] -= 1
            else:
                covered.setdefault(finding, check_.patch.id)
    return covered


def _group(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    grouped: dict[str, list[Finding]] = {}
    for finding in findings:
        grouped.setdefault(finding.file, []).append(finding)
    return grouped


def _multiset(keys: object) -> dict[tuple[str, str, str, str], int]:
    counts: dict[tuple[str, str, str, str], int] = {}
    for key in keys:  # type: ignore[attr-defined]
        counts[key] = counts.get(key, 0) + 1
    return counts
