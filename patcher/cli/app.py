"""The `sglpatch` Typer application: its root options; each command module adds itself to it."""

from __future__ import annotations

from typing import Annotated

import typer

from sglpatch import __version__
from sglpatch.cli.usage import Group, examples

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


def app_commands() -> list[str]:
    """The names of sglpatch's commands."""
    return list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"sglpatch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_version_callback,
            is_eager=True,
            help="Show sglpatch's own version (the SGLang release is a command's --release).",
        ),
    ] = False,
) -> None:
    """Patch an installed SGLang for hardware and models its release does not support yet.

    Exit codes: 0 ok, 1 refused (nothing changed), 2 usage, 3 target problem, 4 ledger problem,
    5 doctor found blockers, 70 internal error, 130 interrupted, 141 output pipe closed.
    """
