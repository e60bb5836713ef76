"""pip puts files back behind the ledger's back: reinstalls and upgrades, with the real pip."""

from __future__ import annotations

import subprocess
import sys
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

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
CHANGED = wheels.applied_targets(SEED)  # the patch targets less those fixed upstream
APPLIES = [row.id for row in api.list_patches(SEED) if row.outlook == "applies"]  # by patch


def pip_install(release: str, site: Path, *flags: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--upgrade", *flags, "--target", str(site),
         str(wheels.wheel(release))],
        check=True,
    )  # fmt: skip


def targets_of(site: Path, release: str) -> dict[str, bytes]:
    return {m: (site / m).read_bytes() for m in wheels.patch_targets(release)}


def test_force_reinstall_then_status_apply_revert(runner: CliRunner, tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip_install(SEED, site)
    pristine = targets_of(site, SEED)
    everything = snapshot(site)
    assert runner.invoke(app, ["apply", "--target", str(site)]).exit_code == 0
    patched = targets_of(site, SEED)
    after = snapshot(site)  # a real, complete install: exactly the patched files change
    assert set(after) == set(everything)
    assert sorted(k for k in after if after[k] != everything[k]) == CHANGED

    pip_install(SEED, site, "--force-reinstall")
    assert targets_of(site, SEED) == pristine
    status = runner.invoke(app, ["status", "--target", str(site)]).stdout
    assert status.count("  not applied ") == len(APPLIES) and "original bytes are back" in status
    assert f"patches: {len(APPLIES)} not applied, " in status

    result = runner.invoke(app, ["revert", "--target", str(site)])  # nothing to undo, no failure
    assert result.exit_code == 0 and result.stdout.count("already had its original bytes") == len(
        CHANGED
    )
    assert targets_of(site, SEED) == pristine

    pip_install(SEED, site, "--force-reinstall")
    assert runner.invoke(app, ["apply", "--target", str(site)]).exit_code == 0
    assert targets_of(site, SEED) == patched
    pip_install(SEED, site, "--force-reinstall")
    result = runner.invoke(app, ["apply", "--target", str(site)])
    assert result.exit_code == 0 and f"Patched {len(CHANGED)} file(s)" in result.stdout
    assert targets_of(site, SEED) == patched
    assert runner.invoke(app, ["revert", "--target", str(site)]).exit_code == 0
    assert targets_of(site, SEED) == pristine


def test_upgrade_never_writes_old_originals_over_the_new_release(
    runner: CliRunner, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    pip_install(SEED, site)
    assert runner.invoke(app, ["apply", "--target", str(site)]).exit_code == 0

    pip_install(UPGRADE, site)
    upgraded = snapshot(site / "sglang")
    status = runner.invoke(app, ["status", "--target", str(site)]).stdout
    assert "release: 0.5.10" in status and "applied to 0.5.9; the target is now 0.5.10" in status

    # status (hashes, declarations) and status --check (codemods where needed) say one thing:
    # what 0.5.10 has upstream is upstream, the rest is missing until apply runs for 0.5.10
    rows = {row.id: row.state for row in api.status(site).patches}
    assert rows == wheels.expected_states(UPGRADE, "not applied")
    check = api.check(site)
    assert set(check.upstream) == {i for i, state in rows.items() if state == "already upstream"}
    assert {m.id for m in check.missing} == {
        i for i, state in rows.items() if state == "not applied"
    }
    assert check.applied == () and check.upgraded_from == SEED
    result = runner.invoke(app, ["status", "--check", "--target", str(site)])
    missing, upstream = len(check.missing), len(check.upstream)
    assert result.exit_code == ExitCode.NOT_IN_PLACE
    assert f"({missing} missing, {upstream} already upstream)" in result.stderr
    assert "patches were applied to 0.5.9, before the upgrade" in result.stderr
    assert f"patches: {missing} not applied, {upstream} already upstream, " in status

    result = runner.invoke(app, ["revert", "--target", str(site)])
    assert result.exit_code == ExitCode.REFUSED
    assert UPGRADE in result.stderr and SEED in result.stderr and "--force" in result.stderr
    assert snapshot(site / "sglang") == upgraded
    # the safe step comes first, as typed; --force (writing 0.5.9 files) after it
    safe = result.stderr.split("To patch 0.5.10, run ")[1].split(" (the 0.5.9 record")[0]
    assert safe == f"sglpatch apply --target {site}"
    assert result.stderr.index(safe) < result.stderr.index("--force")
    result = runner.invoke(app, safe.split()[1:])
    assert result.exit_code == 0, result.stderr
    files = len(wheels.applied_targets(UPGRADE))
    assert f"Patched {files} file(s) ({missing} patch(es) applied, {upstream} already " in (
        result.stdout
    )
    rows = {row.id: row.state for row in api.status(site).patches}
    assert rows == wheels.expected_states(UPGRADE, "applied")
    assert rows["kimi-k25-eagle3-interface"] == "already upstream"
    check = api.check(site)
    assert check.ok and len(check.applied) == missing and len(check.upstream) == upstream

    assert runner.invoke(app, ["revert", "--target", str(site)]).exit_code == 0
    assert snapshot(site / "sglang") == upgraded
    for member in wheels.patch_targets(UPGRADE):
        assert (site / member).read_bytes() == wheels.member(UPGRADE, member)

    log = runner.invoke(app, ["log", "--target", str(site)]).stdout.splitlines()
    assert [line.split()[2] for line in log] == ["revert:", "apply:", "apply:"]
    assert "(SGLang 0.5.10)" in log[1] and "(SGLang 0.5.9)" in log[2]
