"""One SGLang package, one record, however its path is spelled; patched bytes are never
"not applied", even when the record that wrote them is another one (a moved tree, another ledger).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.errors import ExitCode, RefusedError
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets(SEED)
CHANGED = wheels.applied_targets(SEED)  # those a patch applies to (not fixed upstream)
APPLIED = wheels.expected_states(SEED, "applied")
PRISTINE = wheels.expected_states(SEED, "not applied")


def states(target: Path, ledger: Path | None = None) -> dict[str, str]:
    return {row.id: row.state for row in api.status(target, ledger).patches}


def test_a_checkout_seen_from_python_or_from_its_root(tmp_path: Path) -> None:
    """`apply -t X/python` (no .git: read as site-packages) then `revert -t X` (a checkout)."""
    checkout = tmp_path / "X"
    wheels.site_packages(SEED, checkout / "python", TARGETS)
    pristine = snapshot(checkout)
    assert api.apply(checkout / "python", None).written
    assert states(checkout) == APPLIED
    (tmp_path / "link").symlink_to(checkout)
    assert states(tmp_path / "link") == APPLIED
    report = api.revert(checkout)
    assert len(report.restored) == len(CHANGED)
    assert snapshot(checkout) == pristine
    assert states(checkout / "python") == PRISTINE


def test_a_moved_tree_is_patched_not_unpatched(tmp_path: Path) -> None:
    first = wheels.site_packages(SEED, tmp_path / "first", TARGETS)
    assert api.apply(first, None).written
    moved = first.rename(tmp_path / "moved")
    assert states(moved) == wheels.expected_states(SEED, "patched")
    rows = [row for row in api.status(moved).patches if row.state == "patched"]
    assert all("recorded in another ledger at" in row.note for row in rows)
    assert all(str(first) in row.note for row in rows)  # the target the record was made for
    with pytest.raises(RefusedError, match="recorded in another ledger"):
        api.revert(moved)
    outcomes = {o.patch_id: o.state for o in api.apply(moved, None).outcomes}
    assert outcomes == wheels.expected_states(SEED, "already applied")  # by sglpatch


def test_a_relative_ledger_used_from_another_folder(tmp_path: Path) -> None:
    site = wheels.site_packages(SEED, tmp_path / "site", TARGETS)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()

    def sglpatch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sglpatch", *args, "--target", str(site), "--ledger", "L"],
            cwd=cwd, capture_output=True, text=True, check=False,
        )  # fmt: skip

    assert sglpatch(here, "apply").returncode == 0
    status = sglpatch(there, "status")
    assert status.returncode == 0, status.stderr
    assert "not applied" not in status.stdout
    applied = list(APPLIED.values()).count("applied")
    assert status.stdout.count(f"recorded in another ledger at {here / 'L'}") == applied
    refused = sglpatch(there, "revert")
    assert refused.returncode == ExitCode.REFUSED and f"--ledger {here / 'L'}" in refused.stderr
    assert sglpatch(here, "revert").returncode == 0
    assert states(site, here / "L") == PRISTINE
