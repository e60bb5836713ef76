"""The README and the docs pages show only command lines the real CLI accepts, and the README's
first run does, as written, what it says on a real SGLang 0.5.9."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from sglpatch.cli import app
from sglpatch.errors import UsageError
from sglpatch.target import parse_release
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

try:  # typer 0.26 and later carry their own copy of click (as sglpatch.cli.usage imports it)
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_errors  # type: ignore[no-redef,import-not-found,unused-ignore]

REPO = Path(__file__).resolve().parent.parent
# The pages written by hand that show sglpatch's command lines (the generated docs show none).
PAGES = [
    REPO / "README.md",
    *(
        REPO / "docs" / name
        for name in (
            "commands.md",
            "doctor.md",
            "install.md",
            "json.md",
            "ledger.md",
            "layout.md",
            "models-on-12.md",
            "patches.md",
            "speed.md",
            "writing-patches.md",
        )
    ),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SEPARATORS = {";", "&&", "||", "|", "&"}
CAPABILITIES = ("12.0", "12.1")


def shell_lines(text: str) -> Iterator[str]:
    """The shell command lines of a page's code blocks: every line of `sh` blocks, the `$ ` lines
    of `console` blocks, the `RUN` lines of Dockerfiles (continuations joined)."""
    for language, body in FENCE.findall(text):
        body = body.replace("\\\n", " ")
        for line in body.splitlines():
            if language == "sh":
                yield line
            elif language == "console" and line.startswith("$ "):
                yield line[2:]
            elif language == "dockerfile" and line.startswith("RUN "):
                yield line[4:]


def sglpatch_commands(line: str) -> list[list[str]]:
    """The argument lists given to `sglpatch` in one shell line: split at `;`, `&&`, `||` and
    pipes, without redirections and comments."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    words = list(lexer)
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in SEPARATORS:
            commands.append([])
        elif word in (">", ">>", "<", "2>"):
            skip = True  # the file it redirects to
        else:
            commands[-1].append(word)
    return [c[1:] for c in commands if c and Path(c[0]).name == "sglpatch"]


def parse(args: list[str]) -> None:
    """Parse `args` as `sglpatch` would, running no command: click raises on an unknown command
    or option, a missing value or a bad one; a release and a capability are checked as the
    command would check them."""
    group = get_command(app)
    with group.make_context("sglpatch", list(args)) as root:
        rest = [*getattr(root, "_protected_args", []), *root.args]
        if not rest:  # `sglpatch --version` alone exits in its callback, before this
            return
        name, command, rest = group.resolve_command(root, rest)
        assert command is not None and name is not None
        with command.make_context(name, rest, parent=root) as context:
            params = context.params
    if params.get("release") is not None:
        parse_release(params["release"])
    if params.get("capability") is not None:
        assert params["capability"] in CAPABILITIES, params["capability"]


def accepted(args: list[str]) -> bool:
    try:
        parse(args)
    except typer.Exit as done:  # `--version` before a command: the CLI's own answer
        return done.exit_code == 0
    except (click_errors.ClickException, UsageError, AssertionError):
        return False
    return True


def every_command() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for line in shell_lines(page.read_text(encoding="utf-8")):
            found += [(f"{page.relative_to(REPO)}: {line}", c) for c in sglpatch_commands(line)]
    return found


def test_the_pages_show_command_lines() -> None:
    found = every_command()
    # every command shown somewhere, so the reader below is not reading nothing
    shown = {args[0] for _, args in found if args and not args[0].startswith("-")}
    assert shown >= {"apply", "revert", "status", "log", "list", "export", "doctor"}, shown
    assert len(found) >= 25, len(found)


@pytest.mark.parametrize(("where", "args"), every_command(), ids=lambda x: str(x)[:80])
def test_every_command_line_parses(where: str, args: list[str]) -> None:
    assert accepted(args), where


@pytest.mark.parametrize(
    "line",
    [
        "sglpatch apply --dry-rn",  # an unknown option
        "sglpatch aply",  # an unknown command
        "sglpatch export",  # a required option missing
        "sglpatch status --check extra",  # an argument no command takes
        "sglpatch doctor --capability 13.0",  # a value the command refuses
        "sglpatch list --release zero.five",  # a release that is no release
        "sglpatch apply --target",  # an option without its value
    ],
)
def test_a_wrong_line_is_caught(line: str) -> None:
    (args,) = sglpatch_commands(line)
    assert not accepted(args), line


def test_the_reader_splits_shell_lines() -> None:
    line = (
        "pip install x && sglpatch status --check; echo $? | cat > out  # comment\n"
        'cd /tmp && "$(pipx environment --value PIPX_BIN_DIR)/sglpatch" apply --dry-run > a.diff'
    )
    found = [c for one in line.splitlines() for c in sglpatch_commands(one)]
    assert found == [["status", "--check"], ["apply", "--dry-run"]]


# The first run, as the README shows it.

FIRST_RUN_TARGET = "~/venvs/sglang"


def first_run() -> list[tuple[str, int]]:
    """The README's first-run lines, each with the exit code its comment states (0 if none)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- example: first-run -->\n```sh\n(.*?)```", readme, re.S)
    assert match, "the README lost its first run"
    steps = []
    for line in match.group(1).splitlines():
        command, _, comment = line.partition("#")
        code = re.match(r"\s*exit (\d+)", comment)
        steps.append((command.strip(), int(code.group(1)) if code else 0))
    return steps


def test_the_first_run_shows_the_steps_a_user_takes() -> None:
    steps = [shlex.split(command)[1:] for command, _ in first_run()]
    verbs = [s[0] + (" --dry-run" if "--dry-run" in s else "") for s in steps]
    assert verbs[0] == "apply --dry-run" and verbs[-1] == "revert"
    assert {"apply", "status", "doctor"} <= set(verbs)
    for command, _ in first_run():  # one target, named the same way on every line
        assert command.startswith("sglpatch ") and f"--target {FIRST_RUN_TARGET}" in command


def environment(root: Path) -> Path:
    """A virtual environment at `root` holding the real SGLang 0.5.9, and its requirements as
    installed distributions (no code: doctor reads their metadata, not their modules), but none
    of the compiled kernel packages doctor would judge."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    wheels.full_tree(SEED, site)
    metadata = next(site.glob("sglang-*.dist-info")) / "METADATA"
    for line in metadata.read_text(encoding="utf-8").splitlines():
        if line.startswith("Requires-Dist:") and ";" not in line:
            name = re.match(r"[A-Za-z0-9_.-]+", line.split(":", 1)[1].strip())
            assert name is not None, line
            info = site / f"{name.group(0).replace('-', '_')}-0.dist-info"
            info.mkdir(exist_ok=True)
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name.group(0)}\nVersion: 0\n"
            )
    return site


@pytest.mark.wheel
def test_the_first_run_as_written(tmp_path: Path) -> None:
    root = tmp_path / "venvs" / "sglang"
    site = environment(root)
    package = site / "sglang"
    before = snapshot(package)
    script = Path(sys.executable).parent / "sglpatch"  # the console script, as a user runs it
    sglpatch = [str(script)] if script.exists() else [sys.executable, "-m", "sglpatch"]
    env = {**os.environ, "SGLPATCH_LEDGER": str(tmp_path / "ledger")}
    env.pop("VIRTUAL_ENV", None)
    for command, code in first_run():
        line = command.replace(FIRST_RUN_TARGET, shlex.quote(str(root)))
        args = shlex.split(line)
        assert args[0] == "sglpatch"
        done = subprocess.run(
            [*sglpatch, *args[1:]], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == code, (command, done.stdout[-2000:], done.stderr[-2000:])
        if args[1] == "apply" and "--dry-run" not in args:
            changed = {p for p, b in snapshot(package).items() if before.get(p) != b}
            applied = {m.removeprefix("sglang/") for m in wheels.applied_targets(SEED)}
            assert changed == applied
    assert snapshot(package) == before  # revert put every byte back
