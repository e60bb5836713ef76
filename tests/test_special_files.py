"""What is not a regular file, where sglpatch reads or writes one: never waited on, never renamed
over. An output path is written as a shell's `>` would write it; a FIFO or a device where a target
file or a ledger's stored bytes should be is refused at once, naming it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.errors import ExitCode
from sglpatch.store import fsio
from sglpatch.store.git import COMMITTED
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
ROOT = os.geteuid() == 0
# Linux's memory devices (Documentation/admin-guide/devices.txt): major 1, minors 3 and 7.
NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)


def sglpatch(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process of its own; a hang is a failure, not a stuck suite."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "sglpatch", *argv],
            capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"sglpatch {' '.join(argv)} waited on what is not a regular file")


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglpatch: error: "), done.stderr
    assert all(word in lines[0] for word in words), lines[0]


def kinds(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `root`: its type, and the bytes of the regular files (none is opened
    that is not one, so taking it never waits)."""
    found: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        mode = path.lstat().st_mode
        regular = stat.S_ISREG(mode)
        found[str(path.relative_to(root))] = (
            stat.S_IFMT(mode),
            path.read_bytes() if regular else None,
        )
    return found


def device(path: Path, number: int) -> Path:
    os.mknod(path, stat.S_IFCHR | 0o666, number)
    return path


# --- export --output -------------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="making a device node needs root")
@pytest.mark.parametrize("number", [NULL, FULL], ids=["null", "full"])
def test_export_writes_onto_a_device_and_never_replaces_it(
    site_059: Path, tmp_path: Path, number: int
) -> None:
    """`--output /dev/full` replaced the machine's device with a 12 KB file, exit 0."""
    out = device(tmp_path / "dev", number)
    done = sglpatch("export", "--target", str(site_059), "--output", str(out))
    assert stat.S_ISCHR(out.lstat().st_mode) and out.lstat().st_rdev == number
    if number == FULL:
        one_line(done, ExitCode.USAGE, f"cannot write {out}", "No space left on device")
    else:
        assert done.returncode == 0, done.stderr
        files = len(wheels.applied_targets(SEED))
        assert done.stdout.startswith(f"Wrote {out}: {files} file(s)"), done.stdout
        assert "patch -p1" not in done.stdout  # nothing there to apply later


def test_export_writes_through_a_symbolic_link(site_059: Path, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    real = folder / "real.patch"
    real.write_text("old\n")
    real.chmod(0o640)
    link = folder / "link.patch"
    link.symlink_to(real)
    done = sglpatch("export", "--target", str(site_059), "--output", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and link.readlink() == real
    assert real.read_text().startswith("diff --git a/sglang/")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in folder.iterdir()) == ["link.patch", "real.patch"]


def test_export_writes_into_a_fifo_that_is_read(site_059: Path, tmp_path: Path) -> None:
    """The FIFO was renamed over, and its reader waited forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = sglpatch("export", "--target", str(site_059), "--output", str(fifo))
    reader.join(timeout=30)
    assert done.returncode == 0, done.stderr
    assert not reader.is_alive(), "the reader never saw the end of the diff"
    assert got[0].startswith(b"diff --git a/sglang/") and stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("make", ["fifo", "folder"])
def test_export_refuses_a_fifo_nobody_reads_and_a_folder(
    site_059: Path, tmp_path: Path, make: str
) -> None:
    out = tmp_path / "out"
    os.mkfifo(out) if make == "fifo" else out.mkdir()
    done = sglpatch("export", "--target", str(site_059), "--output", str(out))
    reason = "a FIFO that no process reads" if make == "fifo" else "is a folder"
    one_line(done, ExitCode.USAGE, f"cannot write {out}", reason)
    assert stat.S_ISFIFO(out.lstat().st_mode) if make == "fifo" else out.is_dir()


def test_export_onto_a_hard_link_of_a_target_file_never_writes_the_target(
    site_059: Path, tmp_path: Path
) -> None:
    """A file with another hard link was written in place, as `>` would: an output that was a
    link to a target file replaced that file's bytes with the diff."""
    target_file = site_059 / SIZES
    before = target_file.read_bytes()
    out = tmp_path / "out.diff"
    os.link(target_file, out)
    done = sglpatch("export", "--target", str(site_059), "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert target_file.read_bytes() == before
    assert out.read_bytes().startswith(b"diff --git a/sglang/") and out.stat().st_nlink == 1


def test_write_output_refuses_what_a_redirection_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only file of your own (`>` says "Permission denied"; root writes it, as `>` does),
    and a file with other links in a folder no rename can happen in (writing would change the
    other names)."""
    read_only = tmp_path / "ro.patch"
    read_only.write_bytes(b"old")
    read_only.chmod(0o444)
    if not ROOT:
        with pytest.raises(PermissionError):
            fsio.write_output(read_only, b"new")
        assert read_only.read_bytes() == b"old"
    linked = tmp_path / "a"
    linked.write_bytes(b"old")
    os.link(linked, tmp_path / "b")
    real_access = os.access
    monkeypatch.setattr(
        fsio.os, "access", lambda p, mode: Path(p) != tmp_path and real_access(p, mode)
    )
    with pytest.raises(OSError, match="other hard links"):
        fsio.write_output(linked, b"new")
    assert (tmp_path / "b").read_bytes() == b"old"


def test_a_new_output_file_takes_the_umask_as_a_redirection_does(tmp_path: Path) -> None:
    """It was always 0644; `>` under umask 077 makes 0600."""
    old = os.umask(0o077)
    try:
        fsio.write_output(tmp_path / "new.patch", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.patch").stat().st_mode) == 0o600


# --- a target file that is not a regular file ---------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    device(path, os.makedev(1, 5))  # /dev/zero: reading never ends


SPECIALS: list[tuple[str, Callable[[Path], None]]] = [("fifo", _fifo)]
if ROOT:
    SPECIALS.append(("zero", _zero))


@pytest.mark.parametrize("make", [m for _, m in SPECIALS], ids=[n for n, _ in SPECIALS])
def test_a_special_file_at_a_target_is_refused_at_once(
    site_059: Path, tmp_path: Path, make: Callable[[Path], None]
) -> None:
    """apply, apply --dry-run, status --check (the container guard) and export hung on a FIFO
    (a character device: read until memory ran out)."""
    (site_059 / SIZES).unlink()
    make(site_059 / SIZES)
    before = kinds(site_059)
    target = ("--target", str(site_059))
    one_line(sglpatch("apply", *target), ExitCode.TARGET, SIZES, "not a regular file")
    dry = sglpatch("apply", "--dry-run", *target)  # the plan first, then the one error
    assert dry.returncode == ExitCode.TARGET, dry.stderr
    assert (
        dry.stderr.splitlines()[-1]
        == f"sglpatch: error: {SIZES}: not a regular file; nothing was written"
    )
    check = sglpatch("status", "--check", *target)
    assert check.returncode == ExitCode.REFUSED, check.stderr
    assert "sm120-symm-mem-sizes (not a regular file)" in check.stderr
    out = tmp_path / "x.patch"
    one_line(sglpatch("export", "--output", str(out), *target), ExitCode.TARGET, SIZES)
    status = sglpatch("status", *target)  # it said "not applied" as of an ordinary file
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if "sm120-symm-mem-sizes" in line)
    assert row.split()[:2] == ["not", "applied"] and row.endswith("not a regular file"), row
    assert kinds(site_059) == before and not out.exists()


# --- a ledger's stored bytes that are not a regular file -----------------------------------------


@pytest.mark.parametrize("what", ["fifo", "zero", "link"])
def test_stored_originals_that_are_not_files_are_ledger_damage(
    site_059: Path, tmp_path: Path, ledger_dir: Path, what: str
) -> None:
    """revert and export hung on a FIFO among the stored originals, or ran out of memory on a
    link to /dev/zero; a link to an ordinary file was read through."""
    assert api.apply(site_059, None).written
    (stored,) = ledger_dir.glob(f"targets/*/files/original/{SIZES}")
    kept = tmp_path / "kept.py"
    kept.write_bytes(stored.read_bytes())
    stored.unlink()
    if what == "fifo":
        os.mkfifo(stored)
    else:
        stored.symlink_to("/dev/zero" if what == "zero" else kept)
    before = kinds(site_059)
    reason = "not a regular file" if what == "fifo" else "a symbolic link"
    target = ("--target", str(site_059))
    one_line(sglpatch("revert", *target), ExitCode.LEDGER, f"the original bytes of {SIZES}", reason)
    out = tmp_path / "x.patch"
    one_line(sglpatch("export", "--output", str(out), *target), ExitCode.LEDGER, reason)
    assert kinds(site_059) == before and not out.exists()
    stored.unlink()
    stored.write_bytes(kept.read_bytes())  # repaired, revert puts every byte back
    assert sglpatch("revert", *target).returncode == 0
    assert (site_059 / SIZES).read_bytes() == kept.read_bytes()


def test_the_stand_in_devices_are_what_they_claim(tmp_path: Path) -> None:
    """The tests above lean on major 1 minors 3, 5, 7 being null, zero and full (Linux)."""
    if not ROOT:
        pytest.skip("making a device node needs root")
    zero = device(tmp_path / "z", os.makedev(1, 5))
    with zero.open("rb") as handle:
        assert handle.read(4) == b"\0" * 4
    full = device(tmp_path / "f", FULL)
    with pytest.raises(OSError, match="No space"), full.open("wb", buffering=0) as handle:
        handle.write(b"x")


def test_write_output_in_a_folder_it_cannot_write_writes_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`>` writes a writable file in a read-only folder; a rename could not (root ignores the
    folder's mode bits, so the folder is made unwritable through `os.access`)."""
    out = tmp_path / "a.patch"
    out.write_bytes(b"old")
    inode = out.stat().st_ino
    real_access = os.access
    monkeypatch.setattr(
        fsio.os, "access", lambda p, mode: Path(p) != tmp_path and real_access(p, mode)
    )
    fsio.write_output(out, b"new")
    assert out.read_bytes() == b"new" and out.stat().st_ino == inode
    monkeypatch.setattr(fsio.os, "access", real_access)
    fsio.write_output(out, b"newer")  # a folder it can write: one rename, a new inode
    assert out.read_bytes() == b"newer" and out.stat().st_ino != inode


def test_a_fifo_for_the_ledgers_committed_mark_is_not_waited_on(site_059: Path) -> None:
    """The mark that lets reads skip git was read with `read_text`: a FIFO there hung status."""
    assert api.apply(site_059, None).written
    (mark,) = Path(os.environ["XDG_STATE_HOME"]).glob(f"sglpatch/targets/*/.git/{COMMITTED}")
    mark.unlink()
    os.mkfifo(mark)
    done = sglpatch("status", "--target", str(site_059))
    assert done.returncode == 0, done.stderr
    applied = sum(s == "applied" for s in wheels.expected_states(SEED, "applied").values())
    assert f"{applied} applied" in done.stdout, done.stdout  # read from HEAD instead


def test_stored_originals_behind_a_linked_folder_or_changed_are_ledger_damage(
    site_059: Path, tmp_path: Path, ledger_dir: Path
) -> None:
    """A folder of the stored originals replaced by a link to an edited copy: export read it
    through the link and wrote the edit into its diff, exit 0 (revert caught the digest)."""
    assert api.apply(site_059, None).written
    (stored,) = ledger_dir.glob(f"targets/*/files/original/{SIZES}")
    folder = stored.parent
    copy = tmp_path / "copy"
    folder.rename(copy)
    folder.symlink_to(copy)
    (copy / stored.name).write_bytes((copy / stored.name).read_bytes() + b"# TAMPERED\n")
    target = ("--target", str(site_059))
    out = tmp_path / "x.patch"
    for argv in (("export", "--output", str(out)), ("revert",)):
        one_line(sglpatch(*argv, *target), ExitCode.LEDGER, "symbolic link")
    folder.unlink()
    copy.rename(folder)  # the folder back, its file still edited: the digest says so
    one_line(sglpatch("export", "--output", str(out), *target), ExitCode.LEDGER, "is damaged")
    assert not out.exists()
