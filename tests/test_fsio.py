"""Writing target files: all or nothing, mode kept, stale bytecode dropped."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sglpatch.errors import TargetError
from sglpatch.store import fsio


def test_every_file_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [tmp_path / f"{name}.py" for name in "abc"]
    for path in files:
        path.write_bytes(b"old\n")

    def full_disk(step: str, path: Path) -> None:
        if step == "stage" and path.name == "c.py":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsio, "fault_hook", full_disk)
    with pytest.raises(TargetError, match="No space left"):
        fsio.replace_files([(p, b"new\n") for p in files])
    assert [p.read_bytes() for p in files] == [b"old\n"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "b.py", "c.py"]  # no stages left

    monkeypatch.setattr(fsio, "fault_hook", None)
    fsio.replace_files([(p, b"new\n") for p in files])
    assert [p.read_bytes() for p in files] == [b"new\n"] * 3


def test_mode_kept_and_bytecode_dropped(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_bytes(b"x = 1\n")
    path.chmod(0o640)
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-310.pyc").write_bytes(b"")
    (cache / "module.cpython-310.pyc").write_bytes(b"")
    fsio.replace_files([(path, b"x = 2\n")])
    assert path.read_bytes() == b"x = 2\n" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in cache.iterdir()] == ["module.cpython-310.pyc"]


def test_leftover_stages_are_swept(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("")
    (tmp_path / ".mod.py.abc123.sglpatch").write_text("half")
    (tmp_path / ".other.py.abc123.sglpatch").write_text("keep")
    fsio.sweep_stages(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.py.abc123.sglpatch", "mod.py"]


def test_setuid_and_setgid_bits_are_kept(tmp_path: Path) -> None:
    """chown clears them, so the mode is set after it."""
    path = tmp_path / "tool.py"
    path.write_bytes(b"x = 1\n")
    path.chmod(0o6755)
    if path.stat().st_mode & 0o7777 != 0o6755:
        pytest.skip("this file system does not keep setuid bits")
    fsio.replace_files([(path, b"x = 2\n")])
    assert path.read_bytes() == b"x = 2\n"
    assert path.stat().st_mode & 0o7777 == 0o6755
