"""click's side of the command line: usage errors as one line, and `--help` examples.

typer prints click's three-line usage block for a mistyped command or option; sglpatch prints
one `sglpatch: error: ...` line like every other error, keeping click's "did you mean".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from sglpatch.errors import ExitCode, forget_interrupt

try:  # typer 0.26 and later carry their own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_errors  # type: ignore[no-redef,import-not-found,unused-ignore]


class Group(TyperGroup):
    """typer's group, with click's usage errors as sglpatch's one-line errors."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            code = result if isinstance(result, int) else 0
        except click_errors.ClickException as error:
            if type(error).__name__ == "NoArgsIsHelpError":  # bare `sglpatch`: the help
                error.show()
            else:
                _error(usage_message(error))
            code = error.exit_code
        except typer.Abort:
            _error("aborted")
            code = ExitCode.REFUSED
        if code == ExitCode.INTERRUPTED:
            # Said here, for every Ctrl-C: typer ends one that lands while it parses or tears a
            # context down with a silent Exit(130), as the command's handler ends the rest.
            _error("interrupted")
            forget_interrupt()
        if standalone_mode:
            sys.exit(code)
        return code

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            _refuse_version_before_command(args, ctx)
        return list(super().parse_args(ctx, args))


def usage_message(error: Any) -> str:
    """click's message on one line, its suggestion kept, and where the help is."""
    message = " ".join(str(error.format_message()).split())
    message = re.sub(r" \(Possible options: (.+)\)$", r"; did you mean \1?", message)
    ctx = getattr(error, "ctx", None)
    if ctx is None:
        return message
    names = []  # the subcommands; "sglpatch" whatever argv[0] was (python -m sglpatch, ...)
    while ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return f"{message} (see {' '.join(['sglpatch', *reversed(names)])} --help)"


def _refuse_version_before_command(args: list[str], ctx: Any) -> None:
    """`sglpatch --version 0.5.9 apply` would print sglpatch's version and run nothing."""
    at = next((i for i, a in enumerate(args) if a in ("--version", "-V")), None)
    if at is None:
        return
    if any(not a.startswith("-") for a in args[:at]):
        return  # after the command: the command's own (deprecated) --version
    rest = [a for a in args[at + 1 :] if not a.startswith("-")]
    if not rest:
        return
    commands = set(ctx.command.commands)
    command = next((a for a in rest if a in commands), "apply")
    value = rest[0] if rest[0] not in commands else "V"
    raise click_errors.UsageError(
        f"{args[at]} before a command shows sglpatch's own version and runs nothing; to name "
        f"the SGLang release, put --release after the command: sglpatch {command} --release "
        f"{value}",
        ctx,
    )


def examples(*lines: str) -> str:
    """An epilog for `--help`: example command lines, kept as written (click's \\b)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _error(message: str) -> None:
    typer.echo(f"sglpatch: error: {message}", err=True)
