"""The `sglpatch` command: parse, call `sglpatch.api`, print, exit with a documented code."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional, TypeVar

import typer

from sglpatch import __version__, api, as_json
from sglpatch.errors import ExitCode, RefusedError, SglpatchError, UsageError, raised
from sglpatch.results import AlreadyApplied, Failed, NotApplicable, Outcome
from sglpatch.usage import Group, examples

if TYPE_CHECKING:
    from sglpatch.target import Target


def app_commands() -> list[str]:
    """The names of sglpatch's commands."""
    return list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


app = typer.Typer(
    name="sglpatch",
    cls=Group,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=examples(
        "sglpatch apply --dry-run       # the diff for the SGLang in use",
        "sglpatch status --check        # exit 1 unless every patch is in place",
    ),
)

# typer needs Optional[...] at run time on Python 3.10 for these annotations.
TargetOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--target",
        "-t",
        help="site-packages holding sglang/, the sglang package folder, a virtual or conda "
        "environment's root, or a checkout of the sglang repository. Default: the sglang of "
        "$VIRTUAL_ENV, else $CONDA_PREFIX, else this Python's, else python3's on PATH.",
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
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON object; its keys are in the README, section 'JSON'."
    ),
]
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
        ledger = kwargs.get("ledger")
        ledger = ledger if isinstance(ledger, Path) else None
        if sys.stdout is None:  # started with stdout closed: what it would say goes nowhere
            sys.stdout = Path(os.devnull).open("w")  # noqa: SIM115 - lives as long as the process
        _changed.clear()
        try:
            _refuse_undecodable(command, kwargs)
            command(*args, **kwargs)
        except SglpatchError as error:
            message = error.message
            if error.details:  # e.g. a plugin's traceback: kept, not shown
                message += f" (details in {_write_crash_log(ledger, error.details)})"
            _error(message)
            # an error never exits 0, whatever a subclass (a plugin's own?) declares
            raise typer.Exit(error.exit_code or ExitCode.BUG) from None
        except KeyboardInterrupt:
            _exit_interrupted()
        except typer.Exit:
            raise
        except BaseException as error:  # SystemExit too: no command ends by sys.exit
            if _interrupted(error):  # e.g. Ctrl-C in the middle of importing libcst
                _exit_interrupted()
            if isinstance(error, BrokenPipeError) and _stdout_closed():
                # `sglpatch ... | head`: the reader left; say nothing more
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(ExitCode.OK if _changed else ExitCode.BROKEN_PIPE) from None
            if _unwritable_stdout(error):  # full or failing: what was done is done
                raise typer.Exit(ExitCode.OK if _changed else ExitCode.BROKEN_PIPE) from None
            # a bug in sglpatch (a BrokenPipeError from a pipe to git, too): keep the details,
            # show one line
            log = _write_crash_log(ledger)
            _error(f"internal error: {raised(error)} (details in {log})")
            raise typer.Exit(ExitCode.BUG) from None

    return wrapper  # type: ignore[return-value]


def _exit_interrupted() -> NoReturn:
    _error("interrupted")
    # CPython remembers a KeyboardInterrupt that escaped an eval or exec of source text (namedtuple
    # and dataclass creation use them, e.g. while libcst imports) and then ends the process by
    # SIGINT instead of with our exit code. Evaluating any source text clears that flag.
    eval("None")
    raise typer.Exit(ExitCode.INTERRUPTED) from None


# Set by a command once its change is on disk: output that fails after that is no failure.
_changed: list[bool] = []


def _interrupted(error: BaseException) -> bool:
    """Whether `error` was raised while a KeyboardInterrupt was being handled."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


def _stdout_closed() -> bool:
    """Whether stdout's reader went away: fd 1 polls as an error (a pipe) or a hang-up (a socket).

    A BrokenPipeError can come from any pipe (one to git); only a closed stdout means 141.
    """
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): cannot close
        return False
    if not hasattr(select, "poll"):  # no poll (Windows): what a broken pipe meant before
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return True
    gone = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return any(mask & gone for _, mask in events)


def _refuse_undecodable(command: Callable[..., None], given: dict[str, object]) -> None:
    """An option's text holding bytes that are not UTF-8 is a usage error, naming the option.

    Python keeps such bytes of the command line as lone surrogates, which no later step (a
    search of the source, a message) can encode. Paths (`Path` values and `--output`) are left
    alone: a file name needs no encoding.
    """
    for name, value in given.items():
        if name in _PATH_TEXT:
            continue
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and _SURROGATES.search(text):
                shown = text.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
                raise UsageError(f"{_flag(command, name)} '{shown}' is not UTF-8 text")


_PATH_TEXT = ("output",)  # a str option naming a file
_SURROGATES = re.compile("[\udc80-\udcff]")


def _flag(command: Callable[..., None], name: str) -> str:
    """The option (e.g. `--only`) that fills the parameter `name` of `command`."""
    import typing

    try:
        hint = typing.get_type_hints(command, include_extras=True)[name]
    except Exception:  # an annotation that does not resolve: the usual spelling
        hint = None
    for extra in getattr(hint, "__metadata__", ()):
        # typer.Option("--only", ...) keeps the first name as its default in an Annotated hint
        names = [getattr(extra, "default", None), *(getattr(extra, "param_decls", None) or ())]
        declared = [n for n in names if isinstance(n, str) and n.startswith("--")]
        if declared:
            return declared[0]
    return "--" + name.replace("_", "-")


def _unwritable_stdout(error: BaseException) -> bool:
    """An OSError raised by echo writing to stdout (a full disk, a closed descriptor)."""
    if not isinstance(error, OSError) or error.errno not in _OUTPUT_ERRNOS:
        return False
    frame = error.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name == "echo" and "click" in code.co_filename:
            return frame.tb_frame.f_locals.get("err") is not True
        frame = frame.tb_next
    return False


_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF)


def _error(message: str) -> None:
    typer.echo(f"sglpatch: error: {_printable(message)}", err=True)


def _printable(text: str) -> str:
    """`text` with the bytes Python could not decode (lone surrogates) shown as `\\xff`."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte stands for
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _write_crash_log(ledger: Path | None, details: str | None = None) -> str:
    """Append the traceback to `sglpatch-crash.log` in the ledger in use (--ledger or default).

    Never raises: it runs while an error is being reported, which must stay one line.
    """
    import traceback

    try:
        text = details or traceback.format_exc()
    except Exception:
        text = "(the traceback could not be formatted)"
    for folder in _crash_log_folders(ledger):
        path = folder / "sglpatch-crash.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # argv holds undecodable bytes as lone surrogates, a traceback may too
            with path.open("a", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(f"sglpatch {__version__}: {' '.join(sys.argv)}\n{text}\n")
            return str(path)
        except Exception:  # unwritable, not a folder, a path the system refuses: the next one
            continue
    return "nowhere: no writable folder"


def _crash_log_folders(ledger: Path | None) -> list[Path]:
    folders = []
    try:
        from sglpatch.store import default_directory

        folders.append(ledger.absolute() if ledger else default_directory())
    except Exception:  # e.g. no home folder to find the default ledger in
        pass
    folders.append(Path(os.environ.get("TMPDIR") or "/tmp"))
    return folders


def _emit(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2))


def _colour() -> bool:
    return (
        sys.stdout is not None
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )


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
    "would apply": "green",
    "already applied": "green",
    "skipped": "yellow",
    "already upstream": "blue",
    "not for this release": "white",
    "not applied": "yellow",
    "edited since applied": "red",
    "patched": "magenta",
    "failed": "red",
}


# Wide enough for the longest built-in id, so every row's file starts in one column.
ID_WIDTH = 39


def _row(state: str, patch_id: str, detail: str, err: bool = False) -> None:
    colour = _colour() and not err
    label = f"{state:<21}"
    if colour:
        label = _style(label, fg=STATE_COLOURS.get(state, "white"))
    typer.echo(f"  {label} {patch_id:<{ID_WIDTH}} {detail}".rstrip(), err=err, color=colour)


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


def _ids(values: list[str] | None) -> list[str]:
    """`--only a,b --only c` as [a, b, c]."""
    return [i.strip() for value in values or () for i in value.split(",") if i.strip()]


def _command(
    *words: str, target: Path | None = None, ledger: Path | None = None, **options: object
) -> str:
    """A command to run next, carrying the --target, --ledger and `options` the user typed.

    `options` map a flag's name to its value: True for a bare flag, a list for one given per id.
    """
    line = ["sglpatch", *words]
    given: dict[str, object] = {"target": target, "ledger": ledger, **options}
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            line.append(flag)
        elif isinstance(value, list):
            line += [flag, shlex.quote(",".join(value))] if value else []
        elif value not in (None, False):
            line += [flag, shlex.quote(str(value))]
    return " ".join(line)


def _found(target: Target) -> None:
    """Say which SGLang discovery chose when it saw several (one line, on stderr)."""
    if target.also_found:
        typer.echo(
            f"sglpatch: using {target.root} ({target.found_by}); also found "
            f"{', '.join(target.also_found)}; --target chooses",
            err=True,
        )


IdsOption = Optional[list[str]]  # noqa: UP045


@app.command(
    epilog=examples(
        "sglpatch apply --dry-run > sm120.diff      # see the diff; write nothing",
        "sglpatch apply --target ~/venvs/sglang --skip kimi-k25-eagle3-interface",
    )
)
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
    only_ids: Annotated[
        IdsOption,
        typer.Option(
            "--only",
            metavar="ID[,ID]",
            help="Apply only these patches; the others are recorded as skipped.",
            show_default=False,
        ),
    ] = None,
    skip_ids: Annotated[
        IdsOption,
        typer.Option(
            "--skip",
            metavar="ID[,ID]",
            help="Leave these patches out, and record that (status shows them as skipped).",
            show_default=False,
        ),
    ] = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Apply the patches tested for the target's release, all or nothing."""
    only: list[str] | None = _ids(only_ids) if only_ids is not None else None
    skip = _ids(skip_ids)
    if interactive:
        if only is not None or skip:
            raise UsageError("--interactive asks about each patch itself; drop --only/--skip")
        previews = api.preview(target, version, ledger, force=force, catalog=catalog)
        only = _choose(previews, err=json_out)  # --json: stdout is the JSON object alone
        if not only:
            typer.echo("No patch chosen; nothing was written.", err=json_out)
            if json_out:
                _emit(
                    as_json.apply(api.apply(target, version, ledger, dry_run=True, only=()), True)
                )
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
        _changed.append(True)
    if json_out:
        _emit(as_json.apply(report, dry_run))
        if report.failures:
            raise typer.Exit(ExitCode.TARGET)
        return
    err = dry_run  # a dry run's stdout is the diff alone, so it can be saved as a patch file
    if report.finished:
        typer.echo(f"Finished an interrupted {report.finished} first.", err=True)
    found = report.target
    how = f"; found by {found.found_by}" if found.found_by else ""
    typer.echo(f"SGLang {found.release} at {found.root} ({found.layout.value}{how})", err=err)
    _found(found)
    if report.untested:
        typer.echo(f"  --force: running untested patches {', '.join(report.untested)}", err=True)
    for outcome in report.outcomes:
        # a dry run applies nothing: its summary says what would happen
        state = "would apply" if dry_run and outcome.state == "applied" else outcome.state
        _row(state, outcome.patch_id, _describe(outcome), err=err)
    _fail_on(report.failures)
    if dry_run:
        if report.diff:
            typer.echo(_diff(report.diff), nl=False, color=_colour())
        typer.echo(
            f"Dry run: {len(report.changed)} file(s) would change; nothing was written. "
            "Apply: "
            + _command(
                "apply",
                target=target,
                ledger=ledger,
                version=version,
                force=force,
                only=only,
                skip=skip,
                catalog=catalog,
            ),
            err=True,
        )
    elif report.written and report.changed:
        commit = report.commit[:10] if report.commit else "?"
        typer.echo(
            f"Patched {len(report.changed)} file(s); recorded in {report.ledger} "
            f"(commit {commit}). Undo: {_command('revert', target=target, ledger=ledger)}"
        )
    elif report.written:
        typer.echo(f"No file changed; recorded the patches left out as skipped in {report.ledger}.")
    else:
        typer.echo("Nothing to do: every patch for this release is in place or not needed.")


def _choose(previews: list[api.Preview], err: bool = False) -> list[str]:
    """Ask about each patch that would change something, like `git add -p`: y, n or q.

    `err` sends the diffs to stderr too (the prompts always go there). Ctrl-C or the end of
    input aborts the whole apply: nothing chosen so far is written.
    """
    chosen: list[str] = []
    for preview in previews:
        if preview.outcome.state != "applied":
            _row(preview.outcome.state, preview.id, _describe(preview.outcome), err=err)
            continue
        typer.echo(f"\n{preview.id}: {preview.description}", err=err)
        typer.echo(_diff(preview.diff), nl=False, color=_colour() and not err, err=err)
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
    report = api.revert(target, ledger, force=force)
    if report.commit:
        _changed.append(True)
    if json_out:
        _emit(as_json.revert(report))
        return
    _found(report.target)
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
    typer.echo(f"Reverted {len(report.restored)} file(s); recorded in {report.ledger}.")


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
) -> None:
    """Show the target, its release, the ledger, and each patch's state."""
    if check:
        _check(target, ledger, catalog, json_out)
        return
    report = api.status(target, ledger, catalog)
    if json_out:
        _emit(as_json.status(report))
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
        again = _command("apply", target=target, ledger=ledger)
        typer.echo(
            f"pending: an interrupted {report.interrupted}; the next apply or revert finishes "
            f"it (e.g. {again})"
        )
    for row in report.patches:
        _row(row.state, row.id, " - ".join(x for x in (row.file, row.note) if x))


def _check(target: Path | None, ledger: Path | None, catalog: Path | None, json_out: bool) -> None:
    report = api.check(target, ledger, catalog)
    if json_out:
        _emit(as_json.check(report))
    found = report.target
    skipped = f"; skipped by choice: {', '.join(report.skipped)}" if report.skipped else ""
    if report.ok and not json_out:
        typer.echo(
            f"ok: {len(report.in_place)} patch(es) in place on SGLang {found.release} at "
            f"{found.root}{skipped}"
        )
    elif not report.ok:
        missing = ", ".join(
            f"{m.id} ({m.note})" if m.note != "not applied" else m.id for m in report.missing
        )
        _error(
            f"not in place on SGLang {found.release} at {found.root}: {missing}{skipped}; "
            f"run {_command('apply', target=target, ledger=ledger, catalog=catalog)}"
        )
        raise typer.Exit(ExitCode.NOT_IN_PLACE)


@app.command(epilog=examples("sglpatch log", "sglpatch log --json --target ~/venvs/sglang"))
@handled
def log(
    target: TargetOption = None, ledger: LedgerOption = None, json_out: JsonOption = False
) -> None:
    """Show the ledger's history for the target, newest first."""
    record, entries = api.log(target, ledger)
    if json_out:
        _emit(as_json.log(entries, str(record.directory)))
        return
    _found(record.target)
    if not entries:
        typer.echo(f"No history for {record.target.root} in {record.ledger.directory}.")
        return
    for entry in entries:
        typer.echo(f"{entry.commit[:10]}  {entry.date}  {entry.summary}")


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
    rows = api.list_patches(release, catalog)
    if json_out:
        _emit(as_json.catalogue(rows, release))
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
        "sglpatch export --version 0.5.9 --output sm120.patch",
        "sglpatch export --version 0.5.9 --output - | less",
    )
)
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
    _found(report.target)
    _fail_on(report.failures)
    if output == "-":
        typer.echo(report.diff, nl=False)
        return
    typer.echo(
        f"Wrote {output}: {len(report.changed)} file(s), from SGLang {report.target.release}. "
        f"Apply it in {report.target.root} with: patch -p1 < {output}"
    )


@app.command(
    epilog=examples(
        "sglpatch doctor",
        "sglpatch doctor --model kimi_k25 --json",
    )
)
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
    version: VersionOption = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
) -> None:
    """Will this SGLang run on capability-12 GPUs, with EAGLE-3 on your model? Read from its source.

    Exit 0 when ready, 5 when blockers remain (known breakage: a catalogue patch not applied yet,
    or the model's missing EAGLE-3 methods) or a file could not be read or parsed (not judged).
    Suspects (heuristic findings) block only with --strict. A release that cannot be read is
    exit 2 unless --version gives it.
    """
    progress = _progress if _stderr_is_terminal() else None
    report = api.diagnose(
        target,
        model,
        catalog,
        model_path=model_path,
        strict=strict,
        progress=progress,
        version=version,
    )
    if progress is not None:
        sys.stderr.write("\r\033[K")  # clear the progress line
    if json_out:
        _emit(as_json.doctor(report))
    else:
        _print_diagnosis(report)
    global _nothing_to_release  # read by main() once the command is over
    _nothing_to_release = True
    if not report.diagnosis.ready:
        raise typer.Exit(ExitCode.GAPS)


def _stderr_is_terminal() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()  # None: started with stderr closed


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
    unread = [f for f, _ in found.not_judged if f.startswith("sglang/srt/models/")]
    if found.model is not None:
        model = found.model
        state = f"lacks {', '.join(model.missing)}" if model.missing else "has them all"
        typer.echo(f"\nEAGLE-3 on {model.name} ({model.module}): {state}")
    elif found.asked is not None and unread:
        typer.echo(f"\nEAGLE-3 on {found.asked}: not judged ({', '.join(unread)} not read)")
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
    if found.not_judged:
        count = len(found.not_judged)
        typer.echo(f"\nNot judged (could not be read or parsed): {count} file{'s' * (count > 1)}")
        for file, why in found.not_judged:
            typer.echo(f"  {file}: {why}")


# Set by a command that has written everything and holds nothing to release (doctor): main()
# then ends the process without the interpreter's teardown, which frees libcst's classes and
# the parsed source one object at a time (a twentieth of doctor's run).
_nothing_to_release = False


def main() -> None:
    global _nothing_to_release  # set by this run's command only
    _nothing_to_release = False
    try:
        app()
    except SystemExit as done:
        if _nothing_to_release:
            _end_now(done.code)
        raise
    except KeyboardInterrupt:  # before or after a command's own handler (typer building it)
        _error("interrupted")
        eval("None")  # see _exit_interrupted
        sys.exit(ExitCode.INTERRUPTED)


def _end_now(code: object) -> None:
    """Flush the output and end the process at once, with `code`; return if flushing fails,
    so that the usual exit reports it."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: the process started with it closed
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code if isinstance(code, int) else ExitCode.OK if code is None else ExitCode.BUG)
