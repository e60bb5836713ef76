"""scripts/sm120_triage.py on bad input: one line, an exit code, nothing left behind.

Every bad value is refused before a wheel is read, so these tests need no wheels and no network
(a failed download is simulated with pip's own `PIP_NO_INDEX`). bench/run's are in
test_bench_run.py.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import stat
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import wheels
from tests.support.refusals import assert_refused, run_script
from tests.support.releases import SEED, UPGRADE

TRIAGE = wheels.REPO / "scripts" / "sm120_triage.py"
TRIAGE_PROG = "scripts/sm120_triage.py"
KEPT = "the table a good run wrote\n"
# Two small wheels: a test that reaches them on the old code fails fast, not after 0.5.3 -> 0.5.23.
SMALL = ["--from", SEED, "--to", UPGRADE]


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    """An output file from an earlier run: a refused run must leave it as it was."""
    path = tmp_path / "out" / "sm120-upstream.md"
    path.parent.mkdir()
    path.write_text(KEPT)
    return path


def _untouched(kept: Path) -> None:
    assert kept.read_text() == KEPT
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]  # no temporary file left


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--from", "banana"], ["--from", "'banana'", "not a release"]),
        (["--to", "0.5.x"], ["--to", "not a release"]),
        (["--from", "0.5.9+local"], ["--from", "not a release"]),
        (["--from", "0.5.9.post7"], ["--from", "0.5.9.post7", "not a release"]),
        (["--to", "0.5.12.post3"], ["--to", "0.5.12.post3"]),
        (["--from"], ["--from", "expected one argument"]),
        (["--frm", SEED], ["unrecognized arguments: --frm"]),
        (["--from", "0.5.23", "--to", "0.5.3"], ["0.5.23", "0.5.3", "no release"]),
        (["--from", SEED, "--to", SEED], [SEED, "no release"]),
        (["--from", UPGRADE, "--to", SEED], [UPGRADE, SEED, "no release"]),
    ],
)
def test_triage_refuses_a_bad_release_or_range_in_one_line(
    kept: Path, args: list[str], words: list[str]
) -> None:
    done = run_script(TRIAGE, [*args, "--out", str(kept)])
    assert_refused(done, TRIAGE_PROG, 2, *words)
    _untouched(kept)


def _verdicts(tmp_path: Path, content: bytes | str | object) -> Path:
    path = tmp_path / "verdicts.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


GOOD_ROW = {"release": UPGRADE, "verdict": "new-feature", "description": "x", "hunks": []}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ["not JSON", "line 1"]),
        (b"\xff\xfe[]", ["not UTF-8"]),
        ({"release": UPGRADE}, ["a JSON list"]),
        ([UPGRADE], ["change 1", "object"]),
        (
            [GOOD_ROW, {"release": UPGRADE, "description": "x", "hunks": []}],
            ["change 2", "'verdict'"],
        ),
        ([{**GOOD_ROW, "release": 5}], ["change 1", "'release'"]),
        ([{**GOOD_ROW, "release": "soon"}], ["change 1", "'soon'"]),
        ([{**GOOD_ROW, "hunks": [["sglang/a.py"]]}], ["change 1", "'hunks'"]),
        ([{**GOOD_ROW, "hunks": "sglang/a.py"}], ["change 1", "'hunks'"]),
        ([{**GOOD_ROW, "patch": 3}], ["change 1", "'patch'"]),
        (
            [{**GOOD_ROW, "verdict": "maybe"}, {**GOOD_ROW, "verdict": "backported"}],
            ["'maybe'", "backported without patch"],
        ),
    ],
)
def test_triage_refuses_a_malformed_verdicts_file_in_one_line(
    tmp_path: Path, kept: Path, content: object, words: list[str]
) -> None:
    verdicts = _verdicts(tmp_path, content)
    done = run_script(TRIAGE, [*SMALL, "--verdicts", str(verdicts), "--out", str(kept)])
    assert_refused(done, TRIAGE_PROG, 2, "--verdicts", str(verdicts), *words)
    _untouched(kept)


@pytest.mark.parametrize("where", ["missing", "folder"])
def test_triage_refuses_a_verdicts_file_it_cannot_read(
    tmp_path: Path, kept: Path, where: str
) -> None:
    verdicts = tmp_path / "nowhere.json"
    if where == "folder":
        verdicts.mkdir()
    done = run_script(TRIAGE, [*SMALL, "--verdicts", str(verdicts), "--out", str(kept)])
    assert_refused(done, TRIAGE_PROG, 2, "--verdicts", str(verdicts))
    _untouched(kept)


@pytest.mark.parametrize(
    "where", ["missing folder", "file as folder", "a folder", "check a folder"]
)
def test_triage_refuses_an_out_it_cannot_write(tmp_path: Path, kept: Path, where: str) -> None:
    out = {
        "missing folder": tmp_path / "missing" / "o.md",
        "file as folder": kept / "o.md",
        "a folder": kept.parent,
        "check a folder": kept.parent,
    }[where]
    check = ["--check"] if where.startswith("check") else []
    done = run_script(TRIAGE, [*SMALL, *check, "--out", str(out)])
    assert_refused(done, TRIAGE_PROG, 2, "--out", str(out))
    _untouched(kept)
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_triage_refuses_an_out_in_a_read_only_folder(kept: Path) -> None:
    kept.parent.chmod(0o555)
    try:
        done = run_script(TRIAGE, [*SMALL, "--out", str(kept.parent / "o.md")])
    finally:
        kept.parent.chmod(0o755)
    assert_refused(done, TRIAGE_PROG, 2, "--out", "cannot write")
    _untouched(kept)


def _load_triage() -> ModuleType:
    return importlib.import_module("scripts.sm120_triage")


def _edits_sys_path(source: str) -> bool:
    """The code (not its strings: a child's program may put a tree first on purpose) calls
    `sys.path.insert`, `.append` or `.extend`."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"insert", "append", "extend"}
        and ast.unparse(node.func.value) == "sys.path"
        for node in ast.walk(ast.parse(source))
    )


def test_the_scripts_find_the_development_helpers_without_editing_sys_path() -> None:
    """scripts/ and tests/ import `tests.support` as a package of the repository's root (run
    from there as modules, scripts/__init__.py), never by putting a folder on `sys.path`."""
    found = [
        str(path.relative_to(wheels.REPO))
        for folder in ("scripts", "tests")
        for path in sorted((wheels.REPO / folder).rglob("*.py"))
        if _edits_sys_path(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    assert _edits_sys_path("import sys\nsys.path.insert(0, str(REPO))\n")  # what it looks for
    assert not _edits_sys_path("code = 'sys.path.insert(0, site)'\n")


def test_triage_refuses_an_out_the_system_will_not_let_it_write(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder the OS refuses (a read-only folder for a user, a read-only mount for root)."""
    triage = _load_triage()

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(kept.parent))

    monkeypatch.setattr(triage.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(triage, "collect", lambda first, last: pytest.fail("collected"))
    assert triage.main(["--out", str(kept)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{TRIAGE_PROG}: error: --out {kept}: cannot write in {kept.parent}: Permission denied"
    ]
    _untouched(kept)


def test_triage_writes_its_table_atomically(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write that fails at the last step (the rename) leaves the old table and no temp file."""
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    real_replace = Path.replace

    def fail(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(Path, "replace", fail)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(kept)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{TRIAGE_PROG}: error: "), err
    assert "No space left on device" in err[0]
    _untouched(kept)

    monkeypatch.setattr(Path, "replace", real_replace)
    kept.chmod(0o640)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(kept)]) == 0
    assert kept.read_text().startswith("# SM120 / SM121 changes upstream")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640  # the table keeps the mode it had
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]


def test_triage_reports_a_failed_download_in_one_line(tmp_path: Path, kept: Path) -> None:
    """No wheel in the cache and none on the index: pip's reason, one line, nothing written."""
    empty = tmp_path / "empty"
    empty.mkdir()
    offline = {
        "SGLPATCH_WHEEL_CACHE": str(empty),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    done = run_script(TRIAGE, ["--from", "0.5.23", "--to", "0.5.24", "--out", str(kept)], offline)
    assert_refused(
        done, TRIAGE_PROG, 1, "sglang 0.5.23", "pip download", "No matching distribution"
    )
    _untouched(kept)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_triage_writes_onto_a_device_and_never_replaces_it(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out /dev/full` replaced the device with a regular file (a rename over it)."""
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    full = kept.parent / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # Linux's /dev/full
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(full)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert stat.S_ISCHR(full.lstat().st_mode) and full.lstat().st_rdev == os.makedev(1, 7)


def test_triage_writes_through_a_symbolic_link(kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    link = kept.parent / "link.md"
    link.symlink_to(kept)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(link)]) == 0
    assert link.is_symlink() and kept.read_text().startswith("# SM120 / SM121 changes upstream")
