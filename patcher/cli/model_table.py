"""`sglpatch doctor --all-models` as text: one line per architecture, one column per checkpoint.

A cell says what that checkpoint does on 12.0 and 12.1 with default flags: `runs`, `apply`
(breaks now, runs after `sglpatch apply`), `breaks` (after apply too), `n/e` (not evaluated),
written once when the two parts agree and as `12.0/12.1` when they do not. Below the table, the
rows that still break or could not be evaluated, each with why and where.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sglpatch.doctor import ModelRow

_SHORT = {"runs": "runs", "breaks": "breaks", "not evaluated": "n/e", "needs": "needs"}
_COLUMNS = ("bf16", "fp8", "modelopt_fp4", "mxfp4")
_WIDTH = 13


def cell(rows: Sequence[ModelRow]) -> str:
    """One checkpoint on the parts judged."""
    shown = [
        "runs" if row.now == "runs" else "apply" if row.after_apply == "runs" else
        _SHORT[row.after_apply] if row.now != "needs" or row.after_apply != "needs" else "needs"
        for row in rows
    ]  # fmt: skip
    return shown[0] if len(set(shown)) == 1 else "/".join(shown)


def print_table(rows: Sequence[ModelRow], parts: Sequence[str], release: str) -> None:
    by_model: dict[tuple[str, str | None], dict[str, list[ModelRow]]] = {}
    for row in rows:
        column = row.quantization or "bf16"
        by_model.setdefault((row.architecture, row.form), {}).setdefault(column, []).append(row)
    counted = {
        "runs": sum(1 for r in rows if r.now == "runs"),
        "apply": sum(1 for r in rows if r.now != "runs" and r.after_apply == "runs"),
        "breaks": sum(1 for r in rows if r.after_apply == "breaks"),
        "needs": sum(1 for r in rows if r.after_apply == "needs"),
        "n/e": sum(1 for r in rows if r.after_apply == "not evaluated"),
    }
    typer.echo(
        f"\nModels on {' and '.join(parts)} (SGLang {release}, default flags; "
        f"{len(by_model)} architectures, {len(rows)} rows): "
        + ", ".join(f"{count} {name}" for name, count in counted.items())
    )
    name_width = max((len(_name(key)) for key in by_model), default=12) + 2
    header = "architecture".ljust(name_width) + "".join(c.ljust(_WIDTH) for c in _COLUMNS)
    typer.echo(f"  {header.rstrip()}")
    for key, columns in sorted(by_model.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        cells = "".join((cell(columns[c]) if c in columns else "").ljust(_WIDTH) for c in _COLUMNS)
        typer.echo(f"  {_name(key).ljust(name_width)}{cells}".rstrip())
    typer.echo(
        "  (runs: runs now; apply: runs after `sglpatch apply`; breaks: after apply too; "
        "needs: a kernel or tool named below; n/e: not evaluated; A/B: 12.0 and 12.1 differ)"
    )
    _print_left(rows)


def _name(key: tuple[str, str | None]) -> str:
    return f"{key[0]} (DSA)" if key[1] == "dsa" else key[0]


def _print_left(rows: Sequence[ModelRow]) -> None:
    """The rows apply leaves broken or unevaluated, one line per reason."""
    left: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        if row.after_apply == "runs":
            continue
        where = f" ({row.file}:{row.line})" if row.file and row.line else ""
        where = where or (f" ({row.file})" if row.file else "")
        reason = (row.after_apply, row.why, where)
        label = f"{_name((row.architecture, row.form))} {row.quantization or 'bf16'}"
        left.setdefault(reason, [])
        if label not in left[reason]:
            left[reason].append(label)
    if not left:
        return
    typer.echo("\nAfter apply, still:")
    for (status, why, where), labels in sorted(left.items()):
        shown = ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")
        typer.echo(f"  - {status}: {shown}\n      {why}{where}")
