"""The ledger on its own: records, commits, history, locks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sglpatch.errors import LedgerError, LockedError, RefusedError
from sglpatch.ledger import FileRecord, Ledger, State, default_directory
from sglpatch.target import Layout, Target


@pytest.fixture
def target(tmp_path: Path) -> Target:
    package = tmp_path / "site" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return Target(tmp_path / "site", Layout.SITE_PACKAGES, None, None)


def test_default_directory_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "xdg" / "sglpatch"
    monkeypatch.setenv("SGLPATCH_LEDGER", str(tmp_path / "chosen"))
    assert default_directory() == tmp_path / "chosen"


def test_state_round_trips() -> None:
    state = State("0.5.9", ["a", "b"], {"sglang/x.py": FileRecord("1" * 64, "2" * 64, ["a"])})
    assert State.from_json(json.loads(state.to_json())) == state


def test_one_repository_per_target_path(tmp_path: Path, target: Target) -> None:
    ledger = Ledger(tmp_path / "ledger")
    other = Target(tmp_path / "other", Layout.SITE_PACKAGES, None, None)
    first, second = ledger.record(target), ledger.record(other)
    assert first.directory != second.directory
    assert first.directory.parent == ledger.directory / "targets"
    assert "site" in first.directory.name  # readable, and unique by a hash of the path
    assert ledger.record(target).directory == first.directory


def test_commits_hold_files_and_state_and_repeat_nothing(tmp_path: Path, target: Target) -> None:
    record = Ledger(tmp_path / "ledger").record(target)
    state = State("0.5.9", ["p"], {"sglang/x.py": FileRecord("a" * 64, "b" * 64, ["p"])})
    first = record.commit(
        "apply: p", state, {"original/sglang/x.py": b"old", "patched/sglang/x.py": b"new"}
    )
    assert (
        record.commit("apply: p", state, {"original/sglang/x.py": b"old"}) == first
    )  # nothing new
    assert record.state() == state
    assert record.stored("original", "sglang/x.py") == b"old"
    second = record.commit("revert: p", State("0.5.9"), {})
    assert [e.commit for e in record.history()] == [second, first]
    assert (tmp_path / "ledger" / "README.md").read_text().startswith("# sglpatch ledger")
    files = subprocess.run(
        ["git", "-C", str(record.directory), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(files) == [
        "files/original/sglang/x.py",
        "files/patched/sglang/x.py",
        "state.json",
        "target.json",
    ]


def test_a_ledger_inside_the_target_is_refused(target: Target) -> None:
    with pytest.raises(RefusedError, match="inside the target"):
        Ledger(target.root / "sglang" / "ledger").record(target)


def test_the_lock_excludes_a_second_holder(tmp_path: Path, target: Target) -> None:
    record = Ledger(tmp_path / "ledger").record(target)
    second = Ledger(tmp_path / "ledger").record(target)
    with record.locked(), pytest.raises(LockedError, match="another sglpatch"), second.locked(0.1):
        pass
    with record.locked(timeout=0.1):  # released
        pass


def test_damaged_records_are_ledger_errors(tmp_path: Path, target: Target) -> None:
    record = Ledger(tmp_path / "ledger").record(target)
    with pytest.raises(LedgerError, match="missing"):
        record.stored("original", "sglang/nothing.py")
    record.directory.mkdir(parents=True)
    (record.directory / "state.json").write_text("[]")
    with pytest.raises(LedgerError, match="unreadable"):
        record.state()
