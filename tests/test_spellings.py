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
from tests import wheels
from tests.conftest import snapshot

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets("0.5.9")


def states(target: Path, ledger: Path | None = None) -> set[str]:
    return {row.state for row in api.status(target, ledger).patches}


def test_a_checkout_seen_from_python_or_from_its_root(tmp_path: Path) -> None:
    """`apply -t X/python` (no .git: read as site-packages) then `revert -t X` (a checkout)."""
    checkout = tmp_path / "X"
    wheels.site_packages("0.5.9", checkout / "python", TARGETS)
    pristine = snapshot(checkout)
    assert api.apply(checkout / "python", None).written
    assert states(checkout) == {"applied"}
    (tmp_path / "link").symlink_to(checkout)
    assert states(tmp_path / "link") == {"applied"}
    report = api.revert(checkout)
    assert len(report.restored) == 3
    assert snapshot(checkout) == pristine
    assert states(checkout / "python") == {"not applied"}


def test_a_moved_tree_is_patched_not_unpatched(tmp_path: Path) -> None:
    first = wheels.site_packages("0.5.9", tmp_path / "first", TARGETS)
    assert api.apply(first, None).written
    moved = first.rename(tmp_path / "moved")
    rows = api.status(moved).patches
    assert {row.state for row in rows} == {"patched"}
    assert all("recorded in another ledger at" in row.note for row in rows)
    assert all(str(first) in row.note for row in rows)  # the target the record was made for
    with pytest.raises(RefusedError, match="recorded in another ledger"):
        api.revert(moved)
    outcomes = api.apply(moved, None).outcomes
    assert {(o.state, o.by) for o in outcomes} == {("already applied", "sglpatch")}  # type: ignore[attr-defined]


def test_a_relative_ledger_used_from_another_folder(tmp_path: Path) -> None:
    site = wheels.site_packages("0.5.9", tmp_path / "site", TARGETS)
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
    assert status.stdout.count(f"recorded in another ledger at {here / 'L'}") == 3
    refused = sglpatch(there, "revert")
    assert refused.returncode == ExitCode.REFUSED and f"--ledger {here / 'L'}" in refused.stderr
    assert sglpatch(here, "revert").returncode == 0
    assert states(site, here / "L") == {"not applied"}
