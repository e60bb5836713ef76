"""One option names the SGLang release on every command that takes one: `--release` (`-r`).
`--version`/`-V` after a command still works with a one-line warning (scripts and the README's
old recipes); before it, as in pip and ruff, they are sglpatch's own version. Errors name the
option the user typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import __version__
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support.releases import SEED

RELEASE_COMMANDS = ["apply", "export", "doctor", "status", "list"]
DEPRECATED = (
    "sglpatch: warning: --version is deprecated for the SGLang release; use --release "
    "(sglpatch --version shows sglpatch's own version)\n"
)


def invoke(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", RELEASE_COMMANDS)
def test_every_command_that_takes_the_release_takes_release(
    runner: CliRunner, command: str
) -> None:
    code, out, _ = invoke(runner, command, "--help")
    assert code == 0 and "-r, --release" in out
    assert "--version" not in out  # the deprecated spelling is not advertised


@pytest.mark.parametrize("command", RELEASE_COMMANDS)
@pytest.mark.parametrize("option", ["--release", "-r"])
def test_a_malformed_release_names_the_option_typed(
    runner: CliRunner, command: str, option: str
) -> None:
    """`list --release nope` said "--version 'nope' is not a release number"."""
    extra = ["--output", "-"] if command == "export" else []
    code, out, err = invoke(runner, command, option, "nope", *extra)
    assert code == ExitCode.USAGE and out == ""
    assert err == "sglpatch: error: --release 'nope' is not a release number (e.g. 0.5.9)\n"


def test_the_deprecated_spelling_is_named_when_it_is_wrong(runner: CliRunner) -> None:
    code, _, err = invoke(runner, "doctor", "--version", "0.5.x")
    assert code == ExitCode.USAGE
    assert (
        err
        == DEPRECATED + "sglpatch: error: --version '0.5.x' is not a release number (e.g. 0.5.9)\n"
    )
    code, _, err = invoke(runner, "apply", "--release", SEED, "--version", "0.5.8")
    assert code == ExitCode.USAGE and f"--release {SEED} and --version 0.5.8 disagree" in err


@pytest.mark.wheel
@pytest.mark.parametrize("spelling", ["--version", "-V"])
def test_the_old_spelling_keeps_working_with_one_warning(
    runner: CliRunner, site_059: Path, spelling: str
) -> None:
    code, out, err = invoke(runner, "apply", spelling, SEED, "--dry-run", "-t", str(site_059))
    assert code == 0, err
    assert err.startswith(DEPRECATED) and err.count("deprecated") == 1
    assert "+++ b/sglang/" in out


@pytest.mark.wheel
def test_release_checks_the_target_as_version_did(runner: CliRunner, site_059: Path) -> None:
    code, _, err = invoke(runner, "apply", "-r", "0.5.8", "--dry-run", "-t", str(site_059))
    assert code == ExitCode.REFUSED
    assert "SGLang 0.5.8 was asked for, but the target's release is 0.5.9" in err
    code, _, err = invoke(runner, "status", "--release", SEED, "-t", str(site_059))
    assert code == 0, err


@pytest.mark.parametrize("spelling", ["--version", "-V"])
def test_before_a_command_it_is_sglpatchs_own_version(runner: CliRunner, spelling: str) -> None:
    code, out, _ = invoke(runner, spelling)
    assert code == 0 and out == f"sglpatch {__version__}\n"
    code, out, err = invoke(runner, spelling, SEED, "apply")
    assert code == ExitCode.USAGE and out == ""
    assert f"sglpatch apply --release {SEED}" in err
