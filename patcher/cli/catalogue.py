"""`sglpatch list` (the catalogue) and `sglpatch export` (the patches as a diff)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from sglpatch import api
from sglpatch.cli import as_json
from sglpatch.cli.app import app
from sglpatch.cli.errors import handled
from sglpatch.cli.options import (
    CatalogOption,
    DeprecatedVersionOption,
    ForceApply,
    JsonOption,
    LedgerOption,
    ReleaseOption,
    TargetOption,
    release_asked,
)
from sglpatch.cli.output import emit, fail_on, say_found
from sglpatch.cli.usage import examples


@app.command(
    "list",
    epilog=examples(
        "sglpatch list",
        "sglpatch list --release 0.5.12       # what apply would do there, grouped by effect",
    ),
)
@handled
def list_(
    release: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--release", "-r", help="Show what apply would do on this SGLang release."),
    ] = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show the catalogue: each patch, what it does, the releases it is tested on, its origin."""
    release = release_asked(release, None)
    rows = api.list_patches(release, catalog)
    if json_out:
        emit(as_json.catalogue(rows, release))
        return
    if release is None:
        for row in rows:
            _catalogue_row(row)
        return
    typer.echo(f"On SGLang {release}:")
    for effect in EFFECTS:
        group = [row for row in rows if row.effect == effect]
        if group:
            typer.echo(f"\n{EFFECTS[effect]} ({len(group)}):")
        for row in group:
            _catalogue_row(row, indent="  ")
            typer.echo(
                f"      on {release}: {row.outlook}" + (f" ({row.file})" if row.file else "")
            )


EFFECTS = {
    "applies": "applies",
    "already upstream": "already upstream (nothing to do)",
    "not for this release": "not for this release (the code it fixes is not there)",
    "refused": "refused: untested on this release (apply --force runs them)",
}


def _catalogue_row(row: api.CatalogueRow, indent: str = "") -> None:
    fixed = f"; upstream since {row.fixed_upstream_in}" if row.fixed_upstream_in else ""
    typer.echo(f"{indent}{row.id}  [{row.origin}]")
    typer.echo(f"{indent}    {row.description}")
    typer.echo(f"{indent}    tested: {row.tested}{fixed}")


@app.command(
    epilog=examples(
        "sglpatch export --release 0.5.9 --output sm120.patch",
        "sglpatch export --release 0.5.9 --output - | less",
    )
)
@handled
def export(
    output: Annotated[
        str, typer.Option("--output", "-o", help="File to write the diff to; - for stdout.")
    ],
    release: ReleaseOption = None,
    target: TargetOption = None,
    ledger: LedgerOption = None,
    force: ForceApply = False,
    catalog: CatalogOption = None,
    old_version: DeprecatedVersionOption = None,
) -> None:
    """Write the patches as a unified diff for `git apply` or `patch -p1` at the target root."""
    version = release_asked(release, old_version)
    report = api.export(target, version, output, ledger, force=force, catalog=catalog)
    say_found(report.target)
    fail_on(report.failures)
    if output == "-":
        typer.echo(report.diff, nl=False)
        return
    wrote = f"Wrote {output}: {len(report.changed)} file(s), from SGLang {report.target.release}."
    if not Path(output).is_file():  # a device or a FIFO: there is no file to apply later
        typer.echo(wrote)
        return
    written = shlex.quote(str(Path(output).absolute()))  # still right after the `cd` it implies
    typer.echo(f"{wrote} Apply it in {report.target.root} with: patch -p1 < {written}")
