"""Options more than one command takes, declared once (as pip's cmdoptions.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

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


VersionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--version", "-V", help="SGLang release the target must be, e.g. 0.5.9.", show_default=False
    ),
]


IdsOption = Optional[list[str]]  # noqa: UP045


def split_ids(values: list[str] | None) -> list[str]:
    """`--only a,b --only c` as [a, b, c]."""
    return [i.strip() for value in values or () for i in value.split(",") if i.strip()]
