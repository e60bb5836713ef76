"""The `sglpatch` command: parse, call `sglpatch.api`, print, exit with a documented code."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from sglpatch import __version__, api, as_json
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

# typer needs Optional[...] at run time on Python 3.10 for these annotations.
TargetOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--target",
        "-t",
        help="site-packages holding sglang/, the sglang package folder, or a checkout of the "
        "sglang repository. Default: the sglang this Python imports, else python3 on PATH.",
        show_default=False,
    ),
]
LedgerOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--ledger",
        help="Ledger directory. Default: $SGLPATCH_LEDGER, else $XDG_STATE_HOME/sglpatch, "
        "else ~/.local/state/sglpatch.",
        show_default=False,
    ),
]
CatalogOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--catalog",
        help="Also load the patch modules in this folder (each *.py holds one Patch).",
        envvar="SGLPATCH_CATALOG",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (README).")]
ForceApply = Annotated[
    bool, typer.Option("--force", help="Run on a release outside the patches' tested range.")
]
VersionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--version", "-V", help="SGLang release the target must be, e.g. 0.5.9.", show_default=False
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
        except BrokenPipeError:  # `sglpatch ... | head`: the reader left; say nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(ExitCode.BROKEN_PIPE) from None
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


def _emit(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2))


def _colour() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _style(text: str, **style: Any) -> str:
    return str(typer.style(text, **style))


def _diff(text: str) -> str:
    if not _colour():
        return text
    painted = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("+++", "---", "diff ")):
            painted.append(_style(line, bold=True))
        elif line.startswith("+"):
            painted.append(_style(line, fg="green"))
        elif line.startswith("-"):
            painted.append(_style(line, fg="red"))
        elif line.startswith("@@"):
            painted.append(_style(line, fg="cyan"))
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
    colour = _colour() and not err
    label = f"{state:<21}"
    if colour:
        label = _style(label, fg=STATE_COLOURS.get(state, "white"))
    typer.echo(f"  {label} {patch_id:<28} {detail}".rstrip(), err=err, color=colour)


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, AlreadyApplied):
        fixed = f"fixed in {outcome.fixed_in}: " if outcome.fixed_in else ""
        return f"{outcome.file}: {fixed}{outcome.detail}"
    if isinstance(outcome, NotApplicable):
        return outcome.reason
    if isinstance(outcome, Failed):
        return f"{outcome.file}: {outcome.reason}" if outcome.file else outcome.reason
    return outcome.file


def _fail_on(failures: list[Failed]) -> None:
    if failures:
        first = failures[0]
        where = f"{first.file}: " if first.file else ""
        _error(f"{where}{first.reason}; nothing was written")
        raise typer.Exit(ExitCode.TARGET)


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
    5 doctor found blockers, 70 internal error, 130 interrupted, 141 output pipe closed.
    """


@app.command()
@handled
def apply(
    version: VersionOption = None,
    target: TargetOption = None,
    ledger: LedgerOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the diff; write nothing.")
    ] = False,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive", "-i", help="Show each patch's reason and diff; ask y/n/q for each."
        ),
    ] = False,
    force: ForceApply = False,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Apply the patches tested for the target's release, all or nothing."""
    only = None
    if interactive:
        only = _choose(api.preview(target, version, ledger, force=force, catalog=catalog))
        if not only:
            typer.echo("No patch chosen; nothing was written.")
            return
    report = api.apply(
        target, version, ledger, dry_run=dry_run, force=force, catalog=catalog, only=only
    )
    if json_out:
        _emit(as_json.apply(report, dry_run))
        if report.failures:
            raise typer.Exit(ExitCode.TARGET)
        return
    err = dry_run  # a dry run's stdout is the diff alone, so it can be saved as a patch file
    if report.finished:
        typer.echo(f"Finished an interrupted {report.finished} first.", err=True)
    where = f"SGLang {report.target.release} at {report.target.root} ({report.target.layout.value})"
    typer.echo(where, err=err)
    if report.untested:
        typer.echo(f"  --force: running untested patches {', '.join(report.untested)}", err=True)
    for outcome in report.outcomes:
        _row(outcome.state, outcome.patch_id, _describe(outcome), err=err)
    _fail_on(report.failures)
    if dry_run:
        if report.diff:
            typer.echo(_diff(report.diff), nl=False, color=_colour())
        typer.echo(
            f"Dry run: {len(report.changed)} file(s) would change; nothing was written.", err=True
        )
    elif report.written:
        commit = report.commit[:10] if report.commit else "?"
        typer.echo(
            f"Patched {len(report.changed)} file(s); recorded in {report.ledger} "
            f"(commit {commit}). Undo: sglpatch revert"
        )
    else:
        typer.echo("Nothing to do: every patch for this release is in place or not needed.")


def _choose(previews: list[api.Preview]) -> list[str]:
    """Ask about each patch that would change something, like `git add -p`: y, n or q."""
    chosen: list[str] = []
    for preview in previews:
        if preview.outcome.state != "applied":
            _row(preview.outcome.state, preview.id, _describe(preview.outcome))
            continue
        typer.echo(f"\n{preview.id}: {preview.description}")
        typer.echo(_diff(preview.diff), nl=False, color=_colour())
        answer = _ask(f"Apply {preview.id} [y,n,q,?]")
        while answer not in ("y", "n", "q"):
            typer.echo(
                "y: apply this patch; n: skip it; q: quit, applying what was chosen", err=True
            )
            answer = _ask(f"Apply {preview.id} [y,n,q,?]")
        if answer == "q":
            break
        if answer == "y":
            chosen.append(preview.id)
    return chosen


def _ask(question: str) -> str:
    try:
        return str(typer.prompt(question, default="", show_default=False, err=True)).strip()
    except (typer.Abort, EOFError):  # end of input: stop asking, as q does
        return "q"


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
    json_out: JsonOption = False,
) -> None:
    """Restore every file sglpatch changed to its recorded original bytes."""
    report = api.revert(target, ledger, force=force)
    if json_out:
        _emit(as_json.revert(report))
        return
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
def status(
    target: TargetOption = None,
    ledger: LedgerOption = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show the target, its release, the ledger, and each patch's state."""
    report = api.status(target, ledger, catalog)
    if json_out:
        _emit(as_json.status(report))
        return
    found = report.target
    source = f" (from {found.release_source})" if found.release_source else ""
    typer.echo(f"target:  {found.root} ({found.layout.value})")
    typer.echo(f"release: {found.release or 'unknown'}{source}")
    typer.echo(f"ledger:  {report.ledger}")
    if report.interrupted:
        typer.echo(
            f"pending: an interrupted {report.interrupted}; the next apply or revert finishes it"
        )
    for row in report.patches:
        _row(row.state, row.id, " - ".join(x for x in (row.file, row.note) if x))


@app.command()
@handled
def log(
    target: TargetOption = None, ledger: LedgerOption = None, json_out: JsonOption = False
) -> None:
    """Show the ledger's history for the target, newest first."""
    record, entries = api.log(target, ledger)
    if json_out:
        _emit(as_json.log(entries, str(record.directory)))
        return
    if not entries:
        typer.echo(f"No history for {record.target.root} in {record.ledger.directory}.")
        return
    for entry in entries:
        typer.echo(f"{entry.commit[:10]}  {entry.date}  {entry.summary}")


@app.command("list")
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
    rows = api.list_patches(release, catalog)
    if json_out:
        _emit(as_json.catalogue(rows, release))
        return
    for row in rows:
        fixed = f"; upstream since {row.fixed_upstream_in}" if row.fixed_upstream_in else ""
        typer.echo(f"{row.id}  [{row.origin}]")
        typer.echo(f"    {row.description}")
        typer.echo(f"    tested: {row.tested}{fixed}")
        if row.outlook is not None:
            typer.echo(f"    on {release}: {row.outlook}" + (f" ({row.file})" if row.file else ""))


@app.command()
@handled
def export(
    version: Annotated[
        str, typer.Option("--version", "-V", help="SGLang release the target must be.")
    ],
    output: Annotated[
        str, typer.Option("--output", "-o", help="File to write the diff to; - for stdout.")
    ],
    target: TargetOption = None,
    ledger: LedgerOption = None,
    force: ForceApply = False,
    catalog: CatalogOption = None,
) -> None:
    """Write the patches as a unified diff for `git apply` or `patch -p1` at the target root."""
    report = api.export(target, version, output, ledger, force=force, catalog=catalog)
    _fail_on(report.failures)
    if output == "-":
        typer.echo(report.diff, nl=False)
        return
    typer.echo(
        f"Wrote {output}: {len(report.changed)} file(s), from SGLang {report.target.release}. "
        f"Apply it in {report.target.root} with: patch -p1 < {output}"
    )


@app.command()
@handled
def doctor(
    target: TargetOption = None,
    model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--model",
            "-m",
            help="The model to run with EAGLE-3: its architecture from config.json "
            "(KimiK25ForConditionalGeneration) or its models module (kimi_k25).",
            show_default=False,
        ),
    ] = None,
    model_path: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--model-path",
            help="A checkpoint folder: its config.json names the architecture.",
            show_default=False,
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Count every suspect as a blocker.")
    ] = False,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Will this SGLang run on capability-12 GPUs, with EAGLE-3 on your model? Read from its source.

    Exit 0 when ready, 5 when blockers remain (known breakage: a catalogue patch not applied yet,
    or the model's missing EAGLE-3 methods). Suspects (heuristic findings) block only with --strict.
    """
    progress = _progress if _stderr_is_terminal() else None
    report = api.diagnose(
        target, model, catalog, model_path=model_path, strict=strict, progress=progress
    )
    if progress is not None:
        sys.stderr.write("\r\033[K")  # clear the progress line
    if json_out:
        _emit(as_json.doctor(report))
    else:
        _print_diagnosis(report)
    if not report.diagnosis.ready:
        raise typer.Exit(ExitCode.GAPS)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _progress(stage: str) -> None:
    """One overwritten status line on a terminal's stderr; nothing when stderr is not one."""
    sys.stderr.write(f"\r\033[Kdoctor: {stage}...")
    sys.stderr.flush()


def _print_diagnosis(report: api.DoctorReport) -> None:
    found = report.diagnosis
    typer.echo(found.verdict)
    typer.echo(f"  target: {report.target.root}")
    if found.blockers:
        typer.echo("\nBlockers:")
        for blocker in found.blockers:
            fix = f"fixed by `sglpatch apply` ({blocker.fixed_by})" if blocker.fixed_by else ""
            fix = fix or f"no patch yet ({blocker.source})"
            note = f"; {blocker.note}" if blocker.note else ""
            typer.echo(f"  - {blocker.what}\n      {fix}{note}")
    if found.model is not None:
        model = found.model
        state = f"lacks {', '.join(model.missing)}" if model.missing else "has them all"
        typer.echo(f"\nEAGLE-3 on {model.name} ({model.module}): {state}")
    else:
        lacking = found.lacking
        typer.echo(
            f"\nEAGLE-3: {len(lacking)} of {len(found.models)} generation models lack some of "
            f"{', '.join(found.required) or '(nothing required)'}; {len(found.excluded)} other "
            "registered classes are no EAGLE-3 target. Pass --model to check yours."
        )
    suspects = found.suspects
    files = len({s.finding.file for s in suspects})
    covered = sum(1 for s in suspects if s.covered_by)
    label = "blockers under --strict" if found.strict else "heuristic, not blockers"
    typer.echo(
        f"\nSuspects ({label}): {len(suspects)} capability gates in {files} files"
        + (f", {covered} covered by a pending patch" if covered else "")
    )
    for suspect in suspects:
        f = suspect.finding
        cover = f"  [covered by {suspect.covered_by}]" if suspect.covered_by else ""
        typer.echo(f"  {f.file}:{f.line}: {f.code}{cover}")
        if f.kind == "shares":
            typer.echo(f"      shares: 12 gets {f.gets}, as 10 does")
        else:
            typer.echo(f"      {f.kind}: 12 gets {f.gets}; 10 gets {f.like}")
    if found.refusals:
        typer.echo(
            f"\nNot listed: {len(found.refusals)} places that refuse capability 12 with an error "
            "by design (--json lists them)."
        )


def main() -> None:
    app()
