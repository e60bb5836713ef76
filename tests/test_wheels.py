"""The test suite's own wheel download: progress on a terminal, a line elsewhere, one process at
a time for a release, several releases at once."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.releases import SEED, UPGRADE

REPO = Path(__file__).resolve().parent.parent
# Download a release (the seed's) into an empty cache, from a local folder holding its wheel
# (not the network).
SCRIPT = """
import sys
from pathlib import Path
from tests.support import wheels
wheels.CACHE = Path(sys.argv[1])
wheels.PIP_OPTIONS = ["--no-index", "--find-links", sys.argv[2]]
print(wheels.wheel(sys.argv[3]).name, file=sys.stdout)
"""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "index"
    folder.mkdir()
    (folder / wheels.wheel(SEED).name).symlink_to(wheels.wheel(SEED))
    return folder


def _download(cache: Path, source: Path, stderr: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cache), str(source), SEED],
        cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
    )  # fmt: skip


@pytest.mark.wheel
def test_a_download_on_a_terminal_says_what_and_where(tmp_path: Path, source: Path) -> None:
    leader, follower = pty.openpty()
    process = _download(tmp_path / "cache", source, follower)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    out, _ = process.communicate()
    os.close(leader)
    assert process.returncode == 0 and out.decode().startswith(f"sglang-{SEED}-")
    text = shown.decode()
    assert f"downloading the sglang {SEED} wheel into {tmp_path / 'cache'}" in text
    assert "about 360 MB" in text and "SGLPATCH_WHEEL_CACHE" in text
    assert (tmp_path / "cache" / wheels.wheel(SEED).name).is_file()


@pytest.mark.wheel
def test_a_download_off_a_terminal_is_one_line(tmp_path: Path, source: Path) -> None:
    """A CI log gets a line per wheel (so a long first run shows what it waits on), no bar."""
    process = _download(tmp_path / "cache", source, subprocess.PIPE)
    out, err = process.communicate()
    assert process.returncode == 0
    (line,) = err.decode().splitlines()
    assert line.startswith(f"tests: downloading the sglang {SEED} wheel into ")
    assert (tmp_path / "cache" / out.decode().strip()).is_file()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        f".lock-{SEED}",
        out.decode().strip(),
    ]


@pytest.mark.wheel
def test_two_processes_share_one_download(tmp_path: Path, source: Path) -> None:
    """As two pytest-xdist workers do: one downloads, the other waits and finds it whole."""
    both = [_download(tmp_path / "cache", source, subprocess.PIPE) for _ in range(2)]
    results = [process.communicate() for process in both]
    assert all(process.returncode == 0 for process in both)
    names = {out.decode().strip() for out, _ in results}
    assert len(names) == 1
    said = [err.decode().count("downloading the sglang") for _, err in results]
    assert sorted(said) == [0, 1]


FETCH = """
import sys
from pathlib import Path
from tests.support import wheels
wheels.CACHE = Path(sys.argv[1])
wheels.PIP_OPTIONS = ["--no-index", "--find-links", sys.argv[2]]
wheels.fetch(sys.argv[3:], at_once=2)
"""


@pytest.mark.wheel
def test_several_releases_are_fetched_at_once_a_line_each(tmp_path: Path, source: Path) -> None:
    (source / wheels.wheel(UPGRADE).name).symlink_to(wheels.wheel(UPGRADE))
    cache = tmp_path / "cache"
    process = subprocess.run(
        [sys.executable, "-c", FETCH, str(cache), str(source), SEED, UPGRADE, SEED],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    assert sorted(p.name for p in cache.glob("*.whl")) == sorted(
        w.name for w in (wheels.wheel(SEED), wheels.wheel(UPGRADE))
    )
    lines = process.stderr.splitlines()
    assert len(lines) == 2 and all(
        line.startswith("tests: downloading the sglang") for line in lines
    )
