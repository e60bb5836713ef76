"""`sglpatch status` (and `--check`, the entrypoint guard) and `sglpatch log`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sglpatch import api
from sglpatch.cli import as_json
from sglpatch.cli.app import app
from sglpatch.cli.errors import handled, say_error
from sglpatch.cli.options import (
    CatalogOption,
    DeprecatedVersionOption,
    JsonOption,
    LedgerOption,
    ReleaseOption,
    TargetOption,
    release_asked,
)
from sglpatch.cli.output import emit, patch_row, say_found, suggest
from sglpatch.cli.usage import examples
from sglpatch.errors import ExitCode
from sglpatch.reports import tally


@app.command(
    epilog=examples(
        "sglpatch status",
        "sglpatch status --check || exit 1    # in a container entrypoint or a CI job",
    )
)
@handled
def status(
    target: TargetOption = None,
    ledger: LedgerOption = None,
    catalog: CatalogOption = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Print one line; exit 1 if a patch meant for the target's release is not in "
            "place (after a reinstall or an upgrade), 0 if all are. Skipped patches do not count.",
        ),
    ] = False,
    json_out: JsonOption = False,
    release: ReleaseOption = None,
    old_version: DeprecatedVersionOption = None,
) -> None:
    """Show the target, its release, the ledger, and each patch's state."""
    asked = release_asked(release, old_version)
    if check:
        _check(target, ledger, catalog, json_out, asked)
        return
    report = api.status(target, ledger, catalog, asked)
    if json_out:
        emit(as_json.status(report))
        return
    found = report.target
    source = f" (from {found.release_source})" if found.release_source else ""
    typer.echo(f"target:  {found.root} ({found.layout.value})")
    if found.found_by:
        also = f"; also found {', '.join(found.also_found)}" if found.also_found else ""
        typer.echo(f"found:   by {found.found_by}{also}")
    typer.echo(f"release: {found.release or 'unknown'}{source}")
    typer.echo(f"ledger:  {report.ledger}")
    if report.interrupted:
        again = suggest("apply", target=target, ledger=ledger)
        typer.echo(
            f"pending: an interrupted {report.interrupted}; the next apply or revert finishes "
            f"it (e.g. {again})"
        )
    for row in report.patches:
        patch_row(row.state, row.id, " - ".join(x for x in (row.file, row.note) if x))
    typer.echo(f"patches: {counted(tally(row.state for row in report.patches))}")


def counted(counts: dict[str, int]) -> str:
    """`9 applied, 3 already upstream`: how many patches are in each state."""
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "none"


def _check(
    target: Path | None,
    ledger: Path | None,
    catalog: Path | None,
    json_out: bool,
    release: str | None,
) -> None:
    report = api.check(target, ledger, catalog, release)
    if json_out:
        emit(as_json.check(report))
    found = report.target
    skipped = f"; skipped by choice: {', '.join(report.skipped)}" if report.skipped else ""
    in_place = counted(
        {
            "missing": len(report.missing),
            "applied": len(report.applied),
            "already upstream": len(report.upstream),
        }
    )
    if report.ok and not json_out:
        typer.echo(
            f"ok: {len(report.in_place)} patch(es) in place ({in_place}) on SGLang "
            f"{found.release} at {found.root}{skipped}"
        )
    elif not report.ok:
        missing = ", ".join(
            f"{m.id} ({m.note})" if m.note != "not applied" else m.id for m in report.missing
        )
        upgraded = (
            f"; the ledger's patches were applied to {report.upgraded_from}, before the upgrade"
            if report.upgraded_from
            else ""
        )
        again = suggest("apply", target=target, ledger=ledger, release=release, catalog=catalog)
        say_error(
            f"not in place on SGLang {found.release} at {found.root}: {missing} ({in_place})"
            f"{upgraded}{skipped}; run {again}"
        )
        raise typer.Exit(ExitCode.NOT_IN_PLACE)


@app.command(epilog=examples("sglpatch log", "sglpatch log --json --target ~/venvs/sglang"))
@handled
def log(
    target: TargetOption = None, ledger: LedgerOption = None, json_out: JsonOption = False
) -> None:
    """Show the ledger's history for the target, newest first."""
    report = api.log(target, ledger)
    if json_out:
        emit(as_json.log(report))
        return
    say_found(report.target)
    if not report.entries:
        typer.echo(f"No history for {report.target.root} in {report.store}.")
        return
    for entry in report.entries:
        typer.echo(f"{entry.commit[:10]}  {entry.date}  {entry.summary}")
