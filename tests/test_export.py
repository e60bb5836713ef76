"""export: a diff that `git apply` and `patch -p1` turn into exactly what apply writes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED, UPGRADE

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets(SEED)


@pytest.mark.parametrize("tool", [["git", "apply"], ["patch", "-p1", "--quiet"]])
def test_export_applies_byte_identically(
    runner: CliRunner, site_059: Path, tmp_path: Path, tool: list[str]
) -> None:
    if shutil.which(tool[0]) is None:
        pytest.skip(f"{tool[0]} is not installed")
    pristine = snapshot(site_059)
    out = tmp_path / "sm120.patch"
    result = runner.invoke(
        app, ["export", "--version", SEED, "--output", str(out), "--target", str(site_059)]
    )
    assert result.exit_code == 0, result.stderr
    assert snapshot(site_059) == pristine  # the target is untouched

    by_tool = wheels.site_packages(SEED, tmp_path / "by-tool", TARGETS)
    subprocess.run([*tool], stdin=out.open("rb"), cwd=by_tool, check=True)
    api.apply(site_059, None)
    assert snapshot(by_tool) == snapshot(site_059)


def test_export_of_a_patched_target_is_the_same(runner: CliRunner, site_059: Path) -> None:
    first = runner.invoke(app, ["export", "-V", SEED, "-o", "-", "--target", str(site_059)]).stdout
    api.apply(site_059, None)
    second = runner.invoke(app, ["export", "-V", SEED, "-o", "-", "--target", str(site_059)]).stdout
    assert first == second
    assert first.count("diff --git") == len(wheels.applied_targets(SEED))


def test_export_checks_the_release(runner: CliRunner, site_059: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["export", "-V", UPGRADE, "-o", str(tmp_path / "x"), "--target", str(site_059)]
    )
    assert result.exit_code == ExitCode.REFUSED and UPGRADE in result.stderr
    assert not (tmp_path / "x").exists()
