"""`list` (the catalogue, or what apply would do on a release) and `export`."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from sglpatch import catalogue, diff, engine
from sglpatch.api.common import patches_for, record_of, release_of
from sglpatch.errors import RefusedError, UsageError
from sglpatch.patch import Patch
from sglpatch.reports import CatalogueRow, ExportReport
from sglpatch.store import Record, originals_of_patched, write_output
from sglpatch.target import Target, find_target, parse_release


def list_patches(release: str | None = None, catalog: Path | None = None) -> list[CatalogueRow]:
    """The catalogue; with `release`, what apply would do on it (without looking at any files)."""
    version = parse_release(release) if release else None
    return [_row(p, version) for p in catalogue.load(catalog)]


def _row(patch: Patch, release: Version | None) -> CatalogueRow:
    fixed = str(patch.fixed_upstream_in) if patch.fixed_upstream_in else None
    if release is None:
        return CatalogueRow(
            patch.id, patch.description, str(patch.tested), fixed, patch.origin, None, None
        )
    package_path = patch.package_file(release)
    if not patch.is_tested(release):
        effect, outlook = "refused", f"refused: untested on {release} (--force runs it)"
    elif package_path is None:
        effect = outlook = "not for this release"
    elif patch.fixed_upstream(release):
        effect, outlook = "already upstream", f"already upstream (fixed in {fixed})"
    else:
        effect = outlook = "applies"
    file = f"sglang/{package_path}" if package_path else None
    return CatalogueRow(
        patch.id, patch.description, str(patch.tested), fixed, patch.origin, file, outlook, effect
    )


def export(
    target_path: Path | None,
    version: str | None,
    output: str,
    ledger_dir: Path | None = None,
    *,
    force: bool = False,
    catalog: Path | None = None,
) -> ExportReport:
    """The diff `apply` would make on a pristine tree of this release, written to `output`.

    Files sglpatch already patched are diffed from their recorded originals, so the export is
    the same whether or not the target is patched now. Nothing in the target is written.
    """
    target = find_target(target_path, parse_release(version) if version else None)
    release = release_of(target)
    patches, _, _ = patches_for(release, catalog, force)
    record = record_of(target, ledger_dir)
    if output != "-":
        _refuse_output_inside(Path(output), target, record)
    pristine = originals_of_patched(record, release)
    plan = engine.plan(target, patches, release, (), sources=pristine)
    text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
    report = ExportReport(target, text, tuple(c.path for c in plan.changes), plan.outcomes, output)
    if not report.failures and output != "-":
        try:
            write_output(Path(output), text.encode("utf-8"))
        except OSError as error:
            raise UsageError(f"cannot write {output}: {error.strerror or error}") from None
    return report


def _refuse_output_inside(output: Path, target: Target, record: Record) -> None:
    """The diff must never overwrite a file of the target or of the ledger."""
    where = output.resolve()
    for protected, what in ((target.root, "target"), (record.ledger.directory, "ledger")):
        if where.is_relative_to(protected.resolve()):
            raise RefusedError(
                f"--output {output} is inside the {what} {protected}; write it elsewhere"
            )
