"""Counts that add up: every command says how many patches it applied, found already there
(ours or upstream's) and undid, not only how many files it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from tests.support import wheels
from tests.support.releases import NEWEST, SEED

pytestmark = pytest.mark.wheel

TWO_SHOT = "sm120-symm-mem-two-shot"


def effects(release: str) -> tuple[int, int, int, int]:
    """Patches that apply, are already upstream, are not for `release`; files apply changes."""
    rows = api.list_patches(release)
    applies = sum(r.outlook == "applies" for r in rows)
    upstream = sum(r.effect == "already upstream" for r in rows)
    absent = sum(r.effect == "not for this release" for r in rows)
    assert applies + upstream + absent == len(rows)  # on a tested release, nothing is refused
    return applies, upstream, absent, len(wheels.applied_targets(release))


def run(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_every_command_counts_patches_on_the_seed(runner: CliRunner, site_059: Path) -> None:
    applies, upstream, absent, files = effects(SEED)
    target = ["--target", str(site_059)]

    code, _, err = run(runner, "apply", "--dry-run", *target)
    assert code == 0
    assert (
        f"Dry run: {files} file(s) would change ({applies} patch(es) would apply, {upstream} "
        "already upstream); nothing was written." in err
    )
    code, out, err = run(runner, "status", "--check", *target)
    assert code == 1 and f"({applies} missing, {upstream} already upstream); run " in err
    code, out, _ = run(runner, "status", *target)
    assert out.endswith(
        f"\npatches: {applies} not applied, {upstream} already upstream, "
        f"{absent} not for this release\n"
    )

    code, out, err = run(runner, "apply", *target)
    assert code == 0, err
    assert (
        f"Patched {files} file(s) ({applies} patch(es) applied, {upstream} already upstream);"
        in (out)
    )
    code, out, _ = run(runner, "apply", *target)
    assert out.endswith(
        f"Nothing to do: every patch for this release is in place ({applies} patch(es) already "
        f"applied, {upstream} already upstream).\n"
    )
    code, out, _ = run(runner, "status", *target)
    assert out.endswith(
        f"\npatches: {applies} applied, {upstream} already upstream, "
        f"{absent} not for this release\n"
    )
    code, out, _ = run(runner, "status", "--check", *target)
    assert code == 0 and out.startswith(
        f"ok: {applies + upstream} patch(es) in place ({applies} applied, {upstream} already "
        f"upstream) on SGLang {SEED} at {site_059}"
    )

    code, out, _ = run(runner, "revert", *target)
    assert (
        code == 0 and f"Reverted {files} file(s): {applies} patch(es) undone; recorded in " in out
    )


def test_a_patch_added_later_is_counted_apart_from_those_applied_before(
    runner: CliRunner, site_059: Path
) -> None:
    applies, upstream, _, _ = effects(SEED)
    target = ["--target", str(site_059)]
    assert run(runner, "apply", "--skip", TWO_SHOT, *target)[0] == 0
    code, out, _ = run(runner, "status", "--check", *target)
    assert f"({applies - 1} applied, {upstream} already upstream)" in out
    assert f"skipped by choice: {TWO_SHOT}" in out
    code, out, err = run(runner, "apply", *target)
    assert code == 0, err
    assert (
        f"Patched 1 file(s) (1 patch(es) applied, {applies - 1} already applied, {upstream} "
        "already upstream);" in out
    )


def test_the_newest_release_counts_what_is_upstream(runner: CliRunner, tmp_path: Path) -> None:
    """On the newest release most fixes are upstream: `ok: 14` must not read as 14 applied."""
    applies, upstream, _, files = effects(NEWEST)
    site = wheels.site_packages(NEWEST, tmp_path / "site", wheels.patch_targets(NEWEST))
    code, out, err = run(runner, "apply", "--target", str(site))
    assert code == 0, err
    assert f"Patched {files} file(s) ({applies} patch(es) applied, {upstream} already " in out
    code, out, _ = run(runner, "status", "--check", "--target", str(site))
    assert code == 0 and out.startswith(
        f"ok: {applies + upstream} patch(es) in place ({applies} applied, {upstream} already "
        "upstream)"
    )


def test_json_counts_add_up(runner: CliRunner, site_059: Path) -> None:
    applies, upstream, absent, files = effects(SEED)
    total = applies + upstream + absent

    def as_json(*args: str) -> dict[str, object]:
        result = runner.invoke(app, [*args, "--json", "--target", str(site_059)])
        data = json.loads(result.stdout)
        assert isinstance(data, dict)
        return data

    dry = as_json("apply", "--dry-run")["counts"]
    assert dry == {
        "applied": applies,
        "already_applied": 0,
        "already_upstream": upstream,
        "failed": 0,
        "not_for_this_release": absent,
        "files": files,
    }
    assert as_json("apply")["counts"] == dry
    status = as_json("status")
    counts = status["counts"]
    assert isinstance(counts, dict) and sum(counts.values()) == total
    assert counts["applied"] == applies and counts["already_upstream"] == upstream
    check = as_json("status", "--check")
    assert check["counts"] == {
        "in_place": applies + upstream,
        "applied": applies,
        "already_upstream": upstream,
        "missing": 0,
        "skipped": 0,
        "not_for_this_release": absent,
    }
    rows = api.list_patches(SEED)
    assert check["upgraded_from"] is None
    assert check["already_upstream"] == [r.id for r in rows if r.effect == "already upstream"]
    reverted = as_json("revert")
    assert reverted["counts"] == {"restored": files, "already_original": 0, "patches": applies}
    assert reverted["patches"] == [r.id for r in rows if r.outlook == "applies"]
