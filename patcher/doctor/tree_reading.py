"""What doctor reads of a tree before it judges anything: the scan and the catalogue run in the
workers (and the start-up survey, for the rows) while this process reads the models."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from sglpatch.doctor import census, coverage, eagle3
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.gates import devices, scanner, tables
from sglpatch.doctor.read import pool
from sglpatch.doctor.read.source_tree import Source
from sglpatch.doctor.resolve import Outcome, survey
from sglpatch.doctor.resolve.survey import Key
from sglpatch.doctor.resolve.variants import Variant
from sglpatch.patch import Patch

Progress = Callable[[str], None]


class Read(NamedTuple):
    """What doctor reads of the tree before it judges anything."""

    findings: list[Finding]  # the scanner's, in the tree's order
    checks: list[coverage.PatchCheck]  # the catalogue run in memory (none: release unknown)
    required: dict[str, tuple[str, ...]]  # EAGLE-3 method -> where the target's code calls it
    models: census.Models
    registered: list[census.Registered]  # the classes --model chose, or all


def read_tree(
    source: Source,
    package_dir: Path,
    release: Version | None,
    patches: Sequence[Patch],
    paths: Sequence[Path],
    names: set[str] | None,
    helpers: devices.Helpers,
    say: Progress,
    workers: pool.Pool,
    rows_for: Sequence[str] = (),
    flags: Mapping[str, object] = {},
) -> Reading:
    """The scan and the catalogue run in `workers` while this process reads the models."""
    say("scanning capability gates")
    scan = scanner.Scan(source, helpers, workers)  # git grep runs while the tree is listed
    workers.start(scan.listed_up_to(pool.SMALL))
    # Handed over first: loading libcst for the codemods is the largest piece of the work.
    rescan = functools.partial(scan_beside, helpers=helpers, package_dir=package_dir)
    run = (
        workers.run(coverage.check, package_dir, release, patches, _read_again, rescan)
        if release
        else None
    )
    say("reading the EAGLE-3 workers")
    required = eagle3.requirements(source)  # while git grep runs
    say(f"reading {len(paths)} models module(s)")
    models = census.load_models(source, paths)
    registered = [
        r for r in census.registered(source, models, paths) if not names or r.name in names
    ]
    served = sorted({r.name for r in registered if not is_draft(r)})
    # One task: 12.0's run answers for 12.1 too wherever the release lets it.
    surveyed = (
        workers.run(survey.survey, package_dir, tuple(rows_for), tuple(served), flags)
        if rows_for
        else None
    )
    scan.start()
    say("running the catalogue in memory")
    return Reading(package_dir, scan, run, patches, required, models, registered, surveyed)


class Reading:
    """The tree read while the workers scan it and run the catalogue (and the survey)."""

    def __init__(
        self,
        package_dir: Path,
        scan: scanner.Scan,
        run: pool.Task[list[coverage.PatchCheck]] | None,
        patches: Sequence[Patch],
        required: dict[str, tuple[str, ...]],
        models: census.Models,
        registered: list[census.Registered],
        survey: pool.Task[tuple[dict[str, list[Variant]], dict[Key, Outcome]]] | None,
    ) -> None:
        self.package_dir, self.scan, self.run, self.patches = package_dir, scan, run, patches
        self.required, self.models, self.registered = required, models, registered
        self.survey = survey

    @functools.cached_property
    def checks(self) -> list[coverage.PatchCheck]:
        """The catalogue run in memory (none: release unknown)."""
        return _ours(self.run.result(), self.patches) if self.run is not None else []

    def finish(self) -> Read:
        """What the scan found, once it has."""
        findings = beside(self.scan.result(), self.package_dir)
        return Read(findings, self.checks, self.required, self.models, self.registered)


def is_draft(entry: census.Registered) -> bool:
    return bool(entry.excluded and entry.excluded.startswith("a draft"))


def beside(findings: Sequence[Finding], package_dir: Path) -> list[Finding]:
    """The tables their own module never reads, judged by the modules beside them."""
    found = (tables.beside(f, package_dir) for f in findings)
    return [f for f in found if f is not None]


def scan_beside(
    data: bytes, shown: str, helpers: devices.Helpers, package_dir: Path
) -> list[Finding]:
    """A patched file scanned in memory (in a worker, for coverage), tables judged as above."""
    return beside(scanner.scan_bytes(data, shown, helpers), package_dir)


def _read_again(before: bytes) -> bool:
    """Whether doctor reads a pending patch's result for the file `before`: to scan it again
    (`covered_by`, where the scanner can find a decision) or for a model's methods (where a
    class is defined)."""
    return scanner.could_decide(before) or b"class" in before


def _ours(
    checks: Sequence[coverage.PatchCheck], patches: Sequence[Patch]
) -> list[coverage.PatchCheck]:
    """The checks on the caller's own patch objects (a worker answers with copies)."""
    by_id = {patch.id: patch for patch in patches}
    return [check._replace(patch=by_id[check.patch.id]) for check in checks]
