"""Real SGLang releases for the tests: wheels downloaded once into a cache, read with zipfile."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglpatch.patch import Patch

from tests.support.releases import RELEASES

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SGLPATCH_WHEEL_CACHE", REPO / ".cache" / "wheels"))


# Where pip finds the wheels (a test points it at a local folder instead of the index).
PIP_OPTIONS = ["--only-binary=:all:"]
# Lifts pytest's output capture while a download talks to the terminal (set by conftest).
terminal: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext

COMMUNICATORS = "sglang/srt/distributed/device_communicators"
# What a target needs to be recognised and to have its release read.
SKELETON = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py")


@cache
def wheel(release: str) -> Path:
    """The wheel of `release`, downloaded with `pip download --no-deps` on first use.

    Several test processes (pytest-xdist workers, two runs at once) share the cache: one
    downloads while the others wait on its lock, and a wheel appears in the cache whole or not
    at all (downloaded beside it, then renamed in).
    """
    return _fetched(release, talk=True)


def fetch(releases: Iterable[str], at_once: int = 4) -> None:
    """Download the `releases` the cache lacks, `at_once` at a time: most of a download is
    pip's start and the index's answers, which run side by side (one line each, no progress)."""
    from concurrent.futures import ThreadPoolExecutor

    with terminal(), ThreadPoolExecutor(max(1, at_once)) as pool:
        list(pool.map(lambda release: _fetched(release, talk=False), releases))


def _fetched(release: str, talk: bool) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"sglang-{release}-*.whl"))
    if not found:
        with _locked(release):
            found = sorted(CACHE.glob(f"sglang-{release}-*.whl"))
            if not found:
                _download(release, talk)
                found = sorted(CACHE.glob(f"sglang-{release}-*.whl"))
    assert found, f"pip download left no wheel for sglang {release} in {CACHE}"
    return found[0]


@contextlib.contextmanager
def _locked(release: str) -> Iterator[None]:
    """One release's download, one process at a time (other releases meanwhile)."""
    import fcntl

    with (CACHE / f".lock-{release}").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


_saying = threading.Lock()


def _download(release: str, talk: bool) -> None:
    """`pip download` one release, saying so in one line (with `talk`, on a terminal, with
    pip's progress; without, the caller has lifted the capture and others run beside it)."""
    import shutil
    import tempfile

    with terminal() if talk else contextlib.nullcontext():
        shown = talk and sys.stderr.isatty()
        have = len(list(CACHE.glob("sglang-*.whl")))
        with _saying:  # print writes the line and its end apart: downloads side by side
            print(
                f"tests: downloading the sglang {release} wheel into {CACHE} "
                f"({have} of {len(RELEASES)} releases there; all of them take about 360 MB, "
                "once; SGLPATCH_WHEEL_CACHE reuses a folder)",
                file=sys.stderr,
                flush=True,
            )
        quiet = [] if shown else ["--quiet", "--progress-bar", "off"]
        landing = Path(tempfile.mkdtemp(prefix=".download-", dir=CACHE))
        try:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", *quiet, "--no-deps", *PIP_OPTIONS,
                 "--dest", str(landing), f"sglang=={release}"],
                stdout=sys.stderr.fileno() if shown else subprocess.PIPE,  # progress: stderr only
                stderr=None if shown else subprocess.STDOUT,
                text=True,
                check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"pip download sglang=={release} failed:\n{result.stdout or ''}")
            for downloaded in landing.glob("*.whl"):
                downloaded.replace(CACHE / downloaded.name)
        finally:
            shutil.rmtree(landing, ignore_errors=True)


@cache
def _archive(release: str) -> zipfile.ZipFile:
    """Open once per run: reading a large wheel's directory costs more than its members."""
    return zipfile.ZipFile(wheel(release))


def member(release: str, name: str) -> bytes:
    return _archive(release).read(name)


def members(release: str, prefix: str = "sglang/") -> list[str]:
    return [n for n in _archive(release).namelist() if n.startswith(prefix)]


def site_packages(release: str, dest: Path, files: Iterable[str] = ()) -> Path:
    """A site-packages folder holding the release's dist-info, skeleton and `files` (sglang/...)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = _archive(release)
    names = set(archive.namelist())
    wanted = [n for n in names if n.endswith(".dist-info/METADATA")]
    wanted += [n for n in (*SKELETON, *files) if n in names]
    for name in wanted:
        archive.extract(name, dest)
    (dest / "sglang" / "srt").mkdir(exist_ok=True)
    return dest


def patch_targets(release: str) -> list[str]:
    """The wheel members the built-in patches touch on `release` (read from the catalogue)."""
    from packaging.version import Version

    from sglpatch import catalogue

    version = Version(release)
    wanted = {
        f"sglang/{path}" for patch in catalogue.load() if (path := patch.target_file(version))
    }
    present = set(members(release))  # from 0.5.16 some targets live in sglang/kernels/
    return sorted(wanted & present)


def full_tree(release: str, dest: Path) -> Path:
    """A site-packages holding the release's whole sglang package (for doctor)."""
    archive = _archive(release)
    for name in archive.namelist():
        if name.startswith("sglang/") or name.endswith(".dist-info/METADATA"):
            archive.extract(name, dest)
    return dest


def applied_targets(release: str) -> list[str]:
    """The wheel members `apply` changes on `release`: those of the patches that apply there.

    Taken from `list --release` (what `tests/test_matrix.py` checks apply does), so a patch
    that is already upstream on `release` keeps its file in `patch_targets` but not here.
    """
    from sglpatch import api

    present = set(members(release))
    return sorted(
        {
            row.file
            for row in api.list_patches(release)
            if row.outlook == "applies" and row.file in present
        }
    )


def expected_states(release: str, applying: str) -> dict[str, str]:
    """What `status` says of each built-in patch on `release` when every patch that applies there
    is in state `applying` ("applied", "not applied", "skipped", "patched").

    The others keep the effect `list --release` gives them (already upstream, not for this
    release): no apply, skip or revert changes that.
    """
    from sglpatch import api

    return {
        row.id: applying if row.outlook == "applies" else str(row.effect)
        for row in api.list_patches(release)
    }


@cache
def patched(release: str, *, patch: Patch) -> bytes:
    """The file `patch` targets on `release` as `apply` leaves it: the wheel's member, transformed
    in memory. Fails unless the patch applies there. Cached (by release and patch object): a run
    transforms each file once, however many tests read it."""
    from packaging.version import Version

    from sglpatch import engine
    from sglpatch.results import Applied

    version = Version(release)
    target = patch.target_file(version)
    assert target is not None, f"{patch.id} has no file on {release}"
    path = f"sglang/{target}"
    change, outcomes = engine.transform_source(member(release, path), path, [patch], version)
    assert isinstance(outcomes[patch.id], Applied), (release, outcomes[patch.id])
    assert change is not None
    return change.after


def assert_left_alone(patch: Patch, release: str) -> None:
    """On a release with upstream's own fix, `patch` reports it and changes nothing."""
    from packaging.version import Version

    from sglpatch import engine
    from sglpatch.results import AlreadyApplied

    version = Version(release)
    path = f"sglang/{patch.target_file(version)}"
    change, outcomes = engine.transform_source(member(release, path), path, [patch], version)
    outcome = outcomes[patch.id]
    assert change is None, release
    assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream", (release, outcome)


if __name__ == "__main__":  # scripts/test: fetch the wheels while the checks run
    try:
        fetch(RELEASES)
    except RuntimeError as error:  # the tests download again, and say why they could not
        sys.exit(f"tests: prefetching the wheels failed: {str(error).splitlines()[0]}")
