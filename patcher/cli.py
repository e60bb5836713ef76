"""The `sglpatch` command: parse, call `sglpatch.api`, print, exit with a documented code."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from sglpatch import __version__, api
from sglpatch.errors import ExitCode, SglpatchError
from sglpatch.results import AlreadyApplied, Failed, NotApplicable, Outcome

app = typer.Typer(
    name="sglpatch",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

TargetOption = Annotated[
    Path | None,
    typer.Option(
        "--target",
        "-t",
        help="site-packages holding sglang/, the sglang package folder, or a checkout of the "
        "sglang repository. Default: the sglang this Python imports, else python3 on PATH.",
        show_default=False,
    ),
]
LedgerOption = Annotated[
    Path | None,
    typer.Option(
        "--ledger",
        help="Ledger directory. Default: $SGLPATCH_LEDGER, else $XDG_STATE_HOME/sglpatch, "
        "else ~/.local/state/sglpatch.",
        show_default=False,
    ),
]

F = TypeVar("F", bound=Callable[..., None])


def handled(command: F) -> F:
    """Turn sglpatch's errors into one line on stderr and their exit code; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            command(*args, **kwargs)
        except SglpatchError as error:
            _error(error.message)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            _error("interrupted")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        except typer.Exit:
            raise
        except Exception as error:  # a bug in sglpatch: keep the details, show one line
            log = _write_crash_log()
            _error(f"internal error: {type(error).__name__}: {error} (details in {log})")
            raise typer.Exit(ExitCode.BUG) from None

    return wrapper  # type: ignore[return-value]


def _error(message: str) -> None:
    typer.echo(f"sglpatch: error: {message}", err=True)


def _write_crash_log() -> str:
    import traceback

    from sglpatch.ledger import default_directory

    for folder in (default_directory(), Path(os.environ.get("TMPDIR", "/tmp"))):
        path = folder / "sglpatch-crash.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(f"sglpatch {__version__}: {' '.join(sys.argv)}\n")
                handle.write(traceback.format_exc() + "\n")
            return str(path)
        except OSError:
            continue
    return "nowhere: no writable folder"


def _colour() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _paint(text: str, colour: str, enabled: bool) -> str:
    return str(typer.style(text, fg=colour)) if enabled else text


def str_style(text: str, **style: object) -> str:
    return str(typer.style(text, **style))  # type: ignore[arg-type]


def _diff(text: str) -> str:
    if not _colour():
        return text
    painted = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("+++", "---", "diff ")):
            painted.append(str_style(line, bold=True))
        elif line.startswith("+"):
            painted.append(str_style(line, fg="green"))
        elif line.startswith("-"):
            painted.append(str_style(line, fg="red"))
        elif line.startswith("@@"):
            painted.append(str_style(line, fg="cyan"))
        else:
            painted.append(line)
    return "".join(painted)


STATE_COLOURS = {
    "applied": "green",
    "already applied": "green",
    "already upstream": "blue",
    "not for this release": "white",
    "not applied": "yellow",
    "edited since applied": "red",
    "failed": "red",
}


def _row(state: str, patch_id: str, detail: str, err: bool = False) -> None:
    enabled = _colour() and not err
    label = _paint(f"{state:<21}", STATE_COLOURS.get(state, "white"), enabled)
    typer.echo(f"  {label} {patch_id:<28} {detail}".rstrip(), err=err, color=enabled)


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, AlreadyApplied):
        fixed = f"fixed in {outcome.fixed_in}: " if outcome.fixed_in else ""
        return f"{outcome.file}: {fixed}{outcome.detail}"
    if isinstance(outcome, NotApplicable):
        return outcome.reason
    if isinstance(outcome, Failed):
        return f"{outcome.file}: {outcome.reason}" if outcome.file else outcome.reason
    return outcome.file


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"sglpatch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show sglpatch's version."
        ),
    ] = False,
) -> None:
    """Patch an installed SGLang for hardware and models its release does not support yet.

    Exit codes: 0 ok, 1 refused (nothing changed), 2 usage, 3 target problem, 4 ledger problem,
    70 internal error, 130 interrupted.
    """


@app.command()
@handled
def apply(
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            "-V",
            help="SGLang release the target must be, e.g. 0.5.9.",
            show_default=False,
        ),
    ] = None,
    target: TargetOption = None,
    ledger: LedgerOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the diff; write nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Run on a release outside the patches' tested range.")
    ] = False,
) -> None:
    """Apply the patches tested for the target's release, all or nothing."""
    report = api.apply(target, version, ledger, dry_run=dry_run, force=force)
    err = dry_run  # a dry run's stdout is the diff alone, so it can be saved as a patch file
    if report.finished:
        typer.echo(f"Finished an interrupted {report.finished} first.", err=True)
    where = f"SGLang {report.target.release} at {report.target.root} ({report.target.layout.value})"
    typer.echo(where, err=err)
    if report.untested:
        typer.echo(f"  --force: running untested patches {', '.join(report.untested)}", err=True)
    for outcome in report.outcomes:
        _row(outcome.state, outcome.patch_id, _describe(outcome), err=err)
    if report.failures:
        first = report.failures[0]
        _error(f"{first.file}: {first.reason}; nothing was written" if first.file else first.reason)
        raise typer.Exit(ExitCode.TARGET)
    if dry_run:
        if report.diff:
            typer.echo(_diff(report.diff), nl=False, color=_colour())
        typer.echo(
            f"Dry run: {len(report.changed)} file(s) would change; nothing was written.", err=True
        )
    elif report.written:
        typer.echo(
            f"Patched {len(report.changed)} file(s); recorded in {report.ledger} "
            f"(commit {report.commit[:10] if report.commit else '?'}). Undo: sglpatch revert"
        )
    else:
        typer.echo("Nothing to do: every patch for this release is in place or not needed.")


@app.command()
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
) -> None:
    """Restore every file sglpatch changed to its recorded original bytes."""
    report = api.revert(target, ledger, force=force)
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
    typer.echo(f"Reverted {len(report.restored)} file(s); recorded in {report.ledger}.")


@app.command()
@handled
def status(target: TargetOption = None, ledger: LedgerOption = None) -> None:
    """Show the target, its release, the ledger, and each patch's state."""
    report = api.status(target, ledger)
    t = report.target
    source = f" (from {t.release_source})" if t.release_source else ""
    typer.echo(f"target:  {t.root} ({t.layout.value})")
    typer.echo(f"release: {t.release or 'unknown'}{source}")
    typer.echo(f"ledger:  {report.ledger}")
    if report.interrupted:
        typer.echo(
            f"pending: an interrupted {report.interrupted}; the next apply or revert finishes it"
        )
    for row in report.patches:
        detail = " - ".join(x for x in (row.file, row.note) if x)
        _row(row.state, row.id, detail)


@app.command()
@handled
def log(target: TargetOption = None, ledger: LedgerOption = None) -> None:
    """Show the ledger's history for the target, newest first."""
    record, entries = api.log(target, ledger)
    if not entries:
        typer.echo(f"No history for {record.target.root} in {record.ledger.directory}.")
        return
    for entry in entries:
        typer.echo(f"{entry.commit[:10]}  {entry.date}  {entry.summary}")


@app.command("list")
@handled
def list_(
    release: Annotated[
        str | None,
        typer.Option("--release", "-r", help="Show what apply would do on this SGLang release."),
    ] = None,
) -> None:
    """Show the catalogue: each patch, what it does, and the releases it is tested on."""
    rows = api.list_patches(release)
    for row in rows:
        fixed = f"; upstream since {row.fixed_upstream_in}" if row.fixed_upstream_in else ""
        typer.echo(f"{row.id}  [{row.origin}]")
        typer.echo(f"    {row.description}")
        typer.echo(f"    tested: {row.tested}{fixed}")
        if row.outlook is not None:
            typer.echo(f"    on {release}: {row.outlook}" + (f" ({row.file})" if row.file else ""))


def main() -> None:
    app()
