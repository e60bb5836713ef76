"""Options more than one command takes, declared once (as pip's cmdoptions.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sglpatch.errors import UsageError

# typer needs Optional[...] at run time on Python 3.10 for these annotations.
TargetOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--target",
        "-t",
        help="site-packages holding sglang/, the sglang package folder, a virtual or conda "
        "environment's root, or a checkout of the sglang repository. Default: the sglang of "
        "$VIRTUAL_ENV, else $CONDA_PREFIX, else the SGLang tree the current folder is in, else "
        "this Python's, else python3's on PATH.",
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


ReleaseOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--release",
        "-r",
        help="The SGLang release, e.g. 0.5.9: checked against the target's own (refused if it "
        "differs), used where none can be read.",
        show_default=False,
    ),
]


# `--version`/`-V` named the SGLang release on commands before `--release` did; pip, ruff and
# `sglpatch --version` use them for the tool's own version. Kept so scripts keep working.
DeprecatedVersionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--version", "-V", hidden=True, show_default=False),
]


def release_asked(release: str | None, version: str | None) -> str | None:
    """The release `--release` (or the deprecated `--version`) asks for, checked here so an
    error names the option the user typed."""
    if version is not None:
        typer.echo(
            "sglpatch: warning: --version is deprecated for the SGLang release; use --release "
            "(sglpatch --version shows sglpatch's own version)",
            err=True,
        )
        if release is not None and release != version:
            raise UsageError(f"--release {release} and --version {version} disagree; give one")
    text = release if release is not None else version
    if text is not None:
        from sglpatch.target import parse_release

        parse_release(text, "--release" if release is not None else "--version")
    return text


IdsOption = Optional[list[str]]  # noqa: UP045


def split_ids(values: list[str] | None) -> list[str]:
    """`--only a,b --only c` as [a, b, c]."""
    return [i.strip() for value in values or () for i in value.split(",") if i.strip()]
