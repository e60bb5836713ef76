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
        app, ["export", "--release", SEED, "--output", str(out), "--target", str(site_059)]
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


def test_export_takes_the_release_of_the_target_and_a_hint_that_survives_the_cd(
    runner: CliRunner, site_059: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --release needed (as for apply); the command it suggests names the diff absolutely,
    so `cd <target> && patch -p1 < <diff>` works from anywhere."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export", "--output", "sm120.patch", "--target", str(site_059)])
    assert result.exit_code == 0, result.stderr
    assert f"patch -p1 < {tmp_path / 'sm120.patch'}" in result.stdout
    copy = wheels.site_packages(SEED, tmp_path / "copy", wheels.patch_targets(SEED))
    command = result.stdout.split("with: ")[1].strip()
    subprocess.run(["sh", "-c", command], cwd=copy, check=True, capture_output=True)
    api.apply(site_059, None)
    assert snapshot(copy) == snapshot(site_059)


def test_doctor_and_log_json_say_how_the_target_was_found(
    runner: CliRunner, site_059: Path
) -> None:
    import json

    for argv in (["log", "--json"], ["doctor", "--json"]):
        data = json.loads(runner.invoke(app, [*argv, "--target", str(site_059)]).stdout)
        assert data["found_by"] is None and data["also_found"] == [], argv
