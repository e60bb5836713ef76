"""`sglpatch revert`: put back every byte sglpatch changed."""

from __future__ import annotations

from typing import Annotated

import typer

from sglpatch import api
from sglpatch.api.revert import UpgradedSince
from sglpatch.cli import as_json
from sglpatch.cli.app import app
from sglpatch.cli.errors import changed, handled
from sglpatch.cli.options import JsonOption, LedgerOption, TargetOption
from sglpatch.cli.output import emit, say_found, suggest
from sglpatch.cli.usage import examples
from sglpatch.errors import RefusedError


@app.command(
    epilog=examples(
        "sglpatch revert                       # the SGLang that apply found",
        "sglpatch revert --target /sgl-workspace/sglang --force",
    )
)
@handled
def revert(
    target: TargetOption = None,
    ledger: LedgerOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Restore even files edited since; their bytes are kept in the ledger."
        ),
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """Restore every file sglpatch changed to its recorded original bytes."""
    try:
        report = api.revert(target, ledger, force=force)
    except UpgradedSince as upgraded:  # name the safe step first, as the user would type it
        apply = suggest("apply", target=target, ledger=ledger)
        again = suggest("revert", target=target, ledger=ledger, force=True)
        raise RefusedError(upgraded.advice(apply, again)) from None
    if report.commit:
        changed.append(True)
    if json_out:
        emit(as_json.revert(report))
        return
    say_found(report.target)
    if report.finished:
        typer.echo(f"Finished an interrupted {report.finished} first.", err=True)
    if not report.restored and not report.untouched:
        typer.echo(f"Nothing to revert at {report.target.root}.")
        return
    for path in report.saved_edits:
        typer.echo(f"  kept edited bytes of {path} in {report.ledger}")
    for path in report.restored:
        typer.echo(f"  restored {path}")
    for path in report.untouched:
        typer.echo(f"  {path} already had its original bytes")
    for path in report.left:
        typer.echo(f"  left {path}: it is no longer a regular file")
    original = f", {len(report.untouched)} already original" if report.untouched else ""
    typer.echo(
        f"Reverted {len(report.restored)} file(s){original}: {len(report.patches)} patch(es) "
        f"undone; recorded in {report.ledger}."
    )
