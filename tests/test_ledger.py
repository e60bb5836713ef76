"""The ledger on its own: records, commits, history, locks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sglpatch.errors import LedgerError, LockedError, RefusedError
from sglpatch.store import FileRecord, Ledger, State, default_directory
from sglpatch.target import Layout, Target
from tests.support.releases import SEED


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
    state = State(SEED, ["a", "b"], {"sglang/x.py": FileRecord("1" * 64, "2" * 64, ["a"])})
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
    state = State(SEED, ["p"], {"sglang/x.py": FileRecord("a" * 64, "b" * 64, ["p"])})
    first = record.repository.commit(
        "apply: p", state, {"original/sglang/x.py": b"old", "patched/sglang/x.py": b"new"}
    )
    assert (
        record.repository.commit("apply: p", state, {"original/sglang/x.py": b"old"}) == first
    )  # nothing new
    assert record.state() == state
    assert record.stored("original", "sglang/x.py") == b"old"
    second = record.repository.commit("revert: p", State(SEED), {})
    assert [e.commit for e in record.repository.history()] == [second, first]
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


def test_a_failed_commit_leaves_the_committed_state(tmp_path: Path, target: Target) -> None:
    """A commit that fails (a stale index.lock) rolls the work tree back; reads keep HEAD's."""
    record = Ledger(tmp_path / "ledger").record(target)
    applied = State(SEED, ["p"], {"sglang/x.py": FileRecord("a" * 64, "b" * 64, ["p"])})
    record.repository.commit("apply: p", applied, {"original/sglang/x.py": b"old"})
    lock = record.directory / ".git" / "index.lock"
    lock.touch()
    with pytest.raises(LedgerError, match="cannot record"):
        record.repository.commit("revert: p", State(SEED), {"edited/sglang/x.py": b"mine"})
    assert record.state() == applied
    assert json.loads((record.directory / "state.json").read_bytes())["files"]
    assert not (record.directory / "files" / "edited" / "sglang" / "x.py").exists()
    lock.unlink()
    record.repository.commit("revert: p", State(SEED), {})
    assert record.state() == State(SEED)


def test_a_work_tree_that_differs_from_head_is_not_believed(tmp_path: Path, target: Target) -> None:
    """As a process killed between writing state.json and committing leaves it."""
    record = Ledger(tmp_path / "ledger").record(target)
    applied = State(SEED, ["p"], {"sglang/x.py": FileRecord("a" * 64, "b" * 64, ["p"])})
    record.repository.commit("apply: p", applied, {})
    (record.directory / "state.json").write_bytes(State(SEED).to_json())
    assert record.state() == applied
    # A ledger from before the committed-state mark: HEAD is read too.
    (record.directory / ".git" / "sglpatch-committed-state").unlink()
    assert record.state() == applied


def test_keys_a_newer_sglpatch_wrote_are_kept(tmp_path: Path, target: Target) -> None:
    data = {
        "release": SEED,
        "patches": ["p"],
        "files": {"sglang/x.py": {"original": "a", "patched": "b", "patches": ["p"], "mode": 1}},
        "skipped": ["q"],
        "format": 2,
    }
    state = State.from_json(data)
    assert json.loads(state.to_json()) == data
    record = Ledger(tmp_path / "ledger").record(target)
    record.repository.commit("apply: p", state, {})
    assert json.loads((record.directory / "state.json").read_bytes()) == data


def test_one_record_per_package_however_spelled(tmp_path: Path) -> None:
    """A checkout seen from its root or from python/ (no .git) is one package, one record."""
    package = tmp_path / "checkout" / "python" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "checkout")
    spellings = [
        Target(tmp_path / "checkout", Layout.CHECKOUT, None, None),
        Target(tmp_path / "checkout" / "python", Layout.SITE_PACKAGES, None, None),
        Target(tmp_path / "link", Layout.CHECKOUT, None, None),
    ]
    ledger = Ledger(tmp_path / "ledger")
    records = [ledger.record(t) for t in spellings]
    assert len({r.directory for r in records}) == 1
    state = State(SEED, ["p"], {"python/sglang/x.py": FileRecord("a", "b", ["p"])})
    records[0].repository.commit("apply: p", state, {"original/python/sglang/x.py": b"old"})
    as_site = records[1].state()
    assert list(as_site.files) == ["sglang/x.py"]  # the path as that spelling names it
    assert records[1].stored("original", "sglang/x.py") == b"old"


def test_relative_locations_are_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # invalid by the XDG spec: ignored
    assert default_directory() == Path.home() / ".local" / "state" / "sglpatch"
    monkeypatch.setenv("SGLPATCH_LEDGER", "mine")
    assert default_directory() == tmp_path / "mine"
    assert Ledger(Path("other")).directory == tmp_path / "other"


def test_a_commit_that_landed_before_an_error_stands(
    tmp_path: Path, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEAD moved, then something failed (say, the reflog): rolling back would strand it."""
    import git

    record = Ledger(tmp_path / "ledger").record(target)
    record.repository.commit("apply: p", State(SEED, ["p"]), {})
    create = git.Commit.create_from_tree

    def landed_then_failed(cls: type, *args: object, **kwargs: object) -> object:
        create(*args, **kwargs)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(git.Commit, "create_from_tree", classmethod(landed_then_failed))
    sha = record.repository.commit("revert: p", State(SEED), {})
    assert record.state() == State(SEED)
    assert record.repository.history()[0].commit == sha
