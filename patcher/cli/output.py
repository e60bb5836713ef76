"""How results are shown: patch rows, colour, diffs, JSON, and the command to run next."""

from __future__ import annotations

import json
import os
import shlex
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sglpatch.cli.errors import say_error
from sglpatch.errors import ExitCode
from sglpatch.results import AlreadyApplied, Failed, NotApplicable, Outcome

if TYPE_CHECKING:
    from sglpatch.target import Target


def emit(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2))


def colour() -> bool:
    return (
        sys.stdout is not None
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )


def style(text: str, **style: Any) -> str:
    return str(typer.style(text, **style))


def coloured_diff(text: str) -> str:
    if not colour():
        return text
    painted = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("+++", "---", "diff ")):
            painted.append(style(line, bold=True))
        elif line.startswith("+"):
            painted.append(style(line, fg="green"))
        elif line.startswith("-"):
            painted.append(style(line, fg="red"))
        elif line.startswith("@@"):
            painted.append(style(line, fg="cyan"))
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


@cache
def id_width() -> int:
    """Wide enough for the longest built-in id, so every row's file starts in one column (a
    plugin's longer id only shifts its own row)."""
    from sglpatch import catalogue

    return max(len(c.id) for c in map(catalogue.patch_in, catalogue.builtin_modules()))


def patch_row(state: str, patch_id: str, detail: str, err: bool = False) -> None:
    painted = colour() and not err
    label = f"{state:<21}"
    if painted:
        label = style(label, fg=STATE_COLOURS.get(state, "white"))
    typer.echo(f"  {label} {patch_id:<{id_width()}} {detail}".rstrip(), err=err, color=painted)


def describe(outcome: Outcome) -> str:
    if isinstance(outcome, AlreadyApplied):
        fixed = f"fixed in {outcome.fixed_in}: " if outcome.fixed_in else ""
        return f"{outcome.file}: {fixed}{outcome.detail}"
    if isinstance(outcome, NotApplicable):
        return outcome.reason
    if isinstance(outcome, Failed):
        return f"{outcome.file}: {outcome.reason}" if outcome.file else outcome.reason
    return outcome.file


def fail_on(failures: list[Failed]) -> None:
    if failures:
        first = failures[0]
        where = f"{first.file}: " if first.file else ""
        say_error(f"{where}{first.reason}; nothing was written")
        raise typer.Exit(ExitCode.TARGET)


def suggest(
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


def release_note(target: Target) -> str | None:
    """`SGLang 0.5.23, from …: 0.5.24.dev1+g…, a development version after 0.5.23`: the warning
    for a release that was inferred, not read as such; None otherwise."""
    from sglpatch.release import inferred

    if not inferred(target.release_source):
        return None
    return f"SGLang {target.release}, from {target.release_source}"


def say_found(target: Target) -> None:
    """Say which SGLang discovery chose when it saw several (one line, on stderr)."""
    if target.also_found:
        typer.echo(
            f"sglpatch: using {target.root} ({target.found_by}); also found "
            f"{', '.join(target.also_found)}; --target chooses",
            err=True,
        )
