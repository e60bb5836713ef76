"""`sglpatch apply`: show the diff, or apply the patches, all or nothing."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sglpatch import api
from sglpatch.cli import as_json
from sglpatch.cli.app import app
from sglpatch.cli.errors import changed, handled
from sglpatch.cli.options import (
    CatalogOption,
    DeprecatedVersionOption,
    ForceApply,
    IdsOption,
    JsonOption,
    LedgerOption,
    ReleaseOption,
    TargetOption,
    release_asked,
    split_ids,
)
from sglpatch.cli.output import (
    colour,
    coloured_diff,
    describe,
    emit,
    fail_on,
    patch_row,
    release_note,
    say_found,
    suggest,
)
from sglpatch.cli.usage import examples
from sglpatch.errors import ExitCode, RefusedError, UsageError
from sglpatch.reports import tally

DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the diff; write nothing.")]
InteractiveOption = Annotated[
    bool,
    typer.Option(
        "--interactive", "-i", help="Show each patch's reason and diff; ask y/n/q for each."
    ),
]
OnlyOption = Annotated[
    IdsOption,
    typer.Option(
        "--only",
        metavar="ID[,ID]",
        help="Apply only these patches; the others are recorded as skipped.",
        show_default=False,
    ),
]
SkipOption = Annotated[
    IdsOption,
    typer.Option(
        "--skip",
        metavar="ID[,ID]",
        help="Leave these patches out, and record that (status shows them as skipped).",
        show_default=False,
    ),
]


@app.command(
    epilog=examples(
        "sglpatch apply --dry-run > sm120.diff      # see the diff; write nothing",
        "sglpatch apply --target ~/venvs/sglang --skip kimi-k25-eagle3-interface",
    )
)
@handled
def apply(
    release: ReleaseOption = None,
    target: TargetOption = None,
    ledger: LedgerOption = None,
    dry_run: DryRunOption = False,
    interactive: InteractiveOption = False,
    force: ForceApply = False,
    only_ids: OnlyOption = None,
    skip_ids: SkipOption = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
    old_version: DeprecatedVersionOption = None,
) -> None:
    """Apply the patches tested for the target's release, all or nothing."""
    version = release_asked(release, old_version)
    only: list[str] | None = split_ids(only_ids) if only_ids is not None else None
    skip = split_ids(skip_ids)
    if interactive:
        if only is not None or skip:
            raise UsageError("--interactive asks about each patch itself; drop --only/--skip")
        previews = api.preview(target, version, ledger, force=force, catalog=catalog)
        only = _choose(previews, err=json_out)  # --json: stdout is the JSON object alone
        if not only:
            typer.echo("No patch chosen; nothing was written.", err=json_out)
            if json_out:
                emit(as_json.apply(api.apply(target, version, ledger, dry_run=True, only=()), True))
            return
    report = api.apply(
        target,
        version,
        ledger,
        dry_run=dry_run,
        force=force,
        catalog=catalog,
        only=only,
        skip=skip,
        record_skipped=not interactive,
    )
    if report.written:
        changed.append(True)
    if json_out:
        emit(as_json.apply(report, dry_run))
        if report.failures:
            raise typer.Exit(ExitCode.TARGET)
        return
    _show(report, dry_run)
    again = suggest(
        "apply",
        target=target,
        ledger=ledger,
        release=version,
        force=force,
        only=only,
        skip=skip,
        catalog=catalog,
    )
    _conclude(report, dry_run, again, suggest("revert", target=target, ledger=ledger))


def _show(report: api.ApplyReport, dry_run: bool) -> None:
    """The target, then a row per patch; a patch that failed stops here (exit 3)."""
    err = dry_run  # a dry run's stdout is the diff alone, so it can be saved as a patch file
    if report.finished:
        typer.echo(f"Finished an interrupted {report.finished} first.", err=True)
    found = report.target
    how = f"; found by {found.found_by}" if found.found_by else ""
    typer.echo(f"SGLang {found.release} at {found.root} ({found.layout.value}{how})", err=err)
    note = release_note(found)
    if note is not None:  # patched as the release it follows: say so, and from what
        typer.echo(f"sglpatch: warning: taken as {note}", err=True)
    say_found(found)
    if report.untested:
        typer.echo(f"  --force: running untested patches {', '.join(report.untested)}", err=True)
    for outcome in report.outcomes:
        # a dry run applies nothing: its summary says what would happen
        state = "would apply" if dry_run and outcome.state == "applied" else outcome.state
        patch_row(state, outcome.patch_id, describe(outcome), err=err)
    fail_on(report.failures)


def _conclude(report: api.ApplyReport, dry_run: bool, again: str, undo: str) -> None:
    """The diff of a dry run, or what was written, and the command to run next."""
    counts = tally(o.state for o in report.outcomes if o.state != "not for this release")
    if dry_run:
        if report.diff:
            typer.echo(coloured_diff(report.diff), nl=False, color=colour())
        if "applied" in counts:  # as the rows say: it would apply
            counts = {"would apply" if s == "applied" else s: n for s, n in counts.items()}
        typer.echo(
            f"Dry run: {len(report.changed)} file(s) would change ({_counted(counts)}); nothing "
            f"was written. Apply: {again}",
            err=True,
        )
    elif report.written and report.changed:
        commit = report.commit[:10] if report.commit else "?"
        typer.echo(
            f"Patched {len(report.changed)} file(s) ({_counted(counts)}); recorded in "
            f"{report.ledger} (commit {commit}). Undo: {undo}"
        )
    elif report.written:
        typer.echo(f"No file changed; recorded the patches left out as skipped in {report.ledger}.")
    elif counts:
        typer.echo(f"Nothing to do: every patch for this release is in place ({_counted(counts)}).")
    else:
        typer.echo("Nothing to do: no patch is for this release.")


def _counted(counts: dict[str, int]) -> str:
    """`9 patch(es) applied, 3 already upstream`: how many patches ended in each state."""
    said = [f"{n} {state}" for state, n in counts.items()]
    if said:
        said[0] = said[0].replace(" ", " patch(es) ", 1)
    return ", ".join(said) or "no patch"


def _choose(previews: list[api.Preview], err: bool = False) -> list[str]:
    """Ask about each patch that would change something, like `git add -p`: y, n or q.

    `err` sends the diffs to stderr too (the prompts always go there). Ctrl-C or the end of
    input aborts the whole apply: nothing chosen so far is written.
    """
    chosen: list[str] = []
    answered: dict[str, tuple[str, str]] = {}  # a half of a change: the answer its other half got
    for preview in previews:
        if preview.outcome.state != "applied":
            patch_row(preview.outcome.state, preview.id, describe(preview.outcome), err=err)
            continue
        if preview.id in answered:
            given, half = answered[preview.id]
            verdict = "chosen" if given == "y" else "left out"
            typer.echo(f"\n{preview.id}: {preview.description} ({verdict} with {half})", err=err)
            if given == "y":
                chosen.append(preview.id)
            continue
        typer.echo(f"\n{preview.id}: {preview.description}", err=err)
        typer.echo(coloured_diff(preview.diff), nl=False, color=colour() and not err, err=err)
        answer = _ask(f"Apply {preview.id} [y,n,q,?]")
        while answer not in ("y", "n", "q"):
            typer.echo(
                "y: apply this patch; n: skip it (either way with the other halves of its change); "
                "q: quit, applying what was chosen",
                err=True,
            )
            answer = _ask(f"Apply {preview.id} [y,n,q,?]")
        if answer == "q":
            break
        if answer == "y":
            chosen.append(preview.id)
        answered.update((half, (answer, preview.id)) for half in preview.applied_with)
    return chosen


def _ask(question: str) -> str:
    """One answer from stdin; the question goes to stderr (typer.prompt echoes to stdout).

    Ctrl-C raises KeyboardInterrupt (exit 130); the end of input is a refusal (exit 1). Neither
    applies the answers given so far: only y, n and q are answers.
    """
    typer.echo(f"{question}: ", nl=False, err=True)
    line = sys.stdin.readline()
    if not line:
        typer.echo("", err=True)
        raise RefusedError("the input ended before every patch had an answer; nothing was written")
    return line.strip()
