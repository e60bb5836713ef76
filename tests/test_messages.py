"""Every message leads somewhere: one-line errors, hints that carry what the user typed, help
that ends with examples that run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app, app_commands
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

README = Path(__file__).resolve().parent.parent / "README.md"


def invoke(runner: CliRunner, args: list[str]) -> tuple[int, str, str]:
    result = runner.invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["aply"], ["No such command 'aply'", "Did you mean 'apply'?", "sglpatch --help"]),
        (["apply", "--dry-rn"], ["--dry-rn", "did you mean --dry-run?", "sglpatch apply --help"]),
        (["status", "--jsn"], ["--jsn", "did you mean --json?", "sglpatch status --help"]),
        (["export"], ["Missing option '--output'", "sglpatch export --help"]),
        (["apply", "--target"], ["'--target' requires an argument"]),
    ],
)
def test_usage_errors_are_one_line(runner: CliRunner, args: list[str], words: list[str]) -> None:
    code, out, err = invoke(runner, args)
    assert code == ExitCode.USAGE
    assert out == "" and err.count("\n") == 1 and err.startswith("sglpatch: error: ")
    assert all(w in err for w in words), err


def test_usage_errors_from_the_installed_command_too() -> None:
    # The real entry point exits through sys.exit (click's standalone mode), not the test runner.
    result = subprocess.run(
        [sys.executable, "-m", "sglpatch", "aply"], capture_output=True, text=True, check=False
    )
    assert result.returncode == ExitCode.USAGE
    assert result.stderr == (
        "sglpatch: error: No such command 'aply'. Did you mean 'apply'? (see sglpatch --help)\n"
    )


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["--version", SEED, "apply"], "sglpatch apply --release 0.5.9"),
        (["-V", SEED, "export", "-o", "x.diff"], "sglpatch export --release 0.5.9"),
        (["--version", "apply", "--dry-run"], "sglpatch apply --release V"),
    ],
)
def test_version_before_a_command_is_refused(
    runner: CliRunner, args: list[str], suggestion: str
) -> None:
    code, out, err = invoke(runner, args)
    assert code == ExitCode.USAGE and out == ""  # neither sglpatch's version nor the command
    assert err.count("\n") == 1 and suggestion in err


@pytest.mark.wheel
def test_version_alone_and_after_a_command(runner: CliRunner, site_059: Path) -> None:
    code, out, _ = invoke(runner, ["--version"])
    assert code == 0 and out.startswith("sglpatch ")
    code, _, err = invoke(runner, ["apply", "--release", SEED, "--dry-run", "-t", str(site_059)])
    assert code == 0, err


@pytest.mark.wheel
def test_a_dry_run_says_would_apply(runner: CliRunner, site_059: Path) -> None:
    code, _, err = invoke(runner, ["apply", "--dry-run", "--target", str(site_059)])
    assert code == 0, err
    rows = [line for line in err.splitlines() if line.startswith("  ")]
    said = dict(m.group(2, 1) for row in rows if (m := re.match(r"  (\S.*?) {2,}(\S+)", row)))
    assert len(said) == len(rows) and said == wheels.expected_states(SEED, "would apply")
    assert not re.search(r"^\s+applied\s", err, re.M)
    code, out, _ = invoke(runner, ["apply", "--target", str(site_059)])
    assert re.search(r"^\s+applied\s", out, re.M)  # the real run says what it did


@pytest.mark.wheel
def test_hints_carry_the_target_and_ledger_typed_and_work(
    runner: CliRunner, tmp_path: Path
) -> None:
    site = wheels.site_packages(SEED, tmp_path / "my site", wheels.patch_targets(SEED))
    ledger = tmp_path / "my ledger"
    pristine = snapshot(site)
    kimi = "kimi-k25-eagle3-interface"
    typed = ["-t", str(site), "--ledger", str(ledger), "-r", SEED, "--skip", kimi]
    code, _, err = invoke(runner, ["apply", "--dry-run", *typed])
    assert code == 0, err
    hint = err.strip().splitlines()[-1].split("Apply: ")[1]
    assert (
        hint
        == f"sglpatch apply --target '{site}' --ledger '{ledger}' --release 0.5.9 --skip {kimi}"
    )
    code, out, err = invoke(runner, shlex.split(hint)[1:])  # run the hint as a shell would
    others = set(wheels.applied_targets(SEED)) - {"sglang/srt/models/kimi_k25.py"}
    assert code == 0 and f"Patched {len(others)} file(s)" in out, err
    undo = out.strip().splitlines()[-1].split("Undo: ")[1]
    assert undo == f"sglpatch revert --target '{site}' --ledger '{ledger}'"
    code, _, err = invoke(runner, shlex.split(undo)[1:])
    assert code == 0, err
    assert snapshot(site) == pristine


def _help(runner: CliRunner, command: str | None) -> str:
    result = runner.invoke(app, [*([command] if command else []), "--help"])
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("command", [None, *app_commands()])
def test_every_help_ends_with_examples_that_parse(runner: CliRunner, command: str | None) -> None:
    text = _help(runner, command).rstrip().splitlines()
    start = text.index("  Examples:")
    examples = [line.strip() for line in text[start + 1 :]]
    assert 1 <= len(examples) <= 2
    for example in examples:
        # the command line itself: no comment, no shell redirection or pipe
        words = shlex.split(re.split(r"\s+(?:#|>|\||\|\|)\s", example)[0])
        assert words[0] == "sglpatch" and (command is None or words[1] == command)
        code, _, err = invoke(runner, words[1:])
        # with no SGLang installed here, a valid line fails on the target (3), never on usage (2)
        assert code in (ExitCode.OK, ExitCode.TARGET), (example, err)


def test_json_help_names_the_readme_section(runner: CliRunner) -> None:
    headings = re.findall(r"^#+ (.+)$", README.read_text(), re.M)
    for command in app_commands():
        text = " ".join(_help(runner, command).split())
        if "--json" not in text:
            continue
        section = re.search(r"README, section '([^']+)'", text)
        assert section is not None and section.group(1) in headings, command
