"""doctor's scan of whole real trees: shared with worker processes or not, git grep or not, a
pool that cannot start, dies or is left early."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sglpatch.doctor.gates import devices, scanner
from sglpatch.doctor.gates.evaluator import Evaluator
from sglpatch.doctor.read import candidates, pool
from sglpatch.doctor.read.source_tree import Source
from tests.support.releases import SEED


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def started_scan(source: Source, workers: pool.Pool) -> scanner.Scan:
    """A scan of the tree handed to `workers` (opened when the tree is large and a second core
    is there), as `diagnosis.diagnose` starts it."""
    scan = scanner.Scan(source, devices.helpers_of(source), workers)
    workers.start(len(scan.listed))
    scan.start()
    return scan


needs_pool = pytest.mark.skipif(
    pool.usable_cores() < 2, reason="one core: the scan runs in one process anyway"
)


@pytest.mark.wheel
@needs_pool
def test_the_scan_shared_with_worker_processes_equals_the_scan_in_one(
    trees: dict[str, Path],
) -> None:
    source = Source(trees[SEED] / "sglang")
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is not None
        processes = list(workers.executor._processes.values())
        found = shared.result()
    assert processes and not any(p.is_alive() for p in processes)  # ended and reaped
    assert found == scanner.scan(source, devices.helpers_of(source))
    assert len(found) > 20  # a real tree's gates, in the same order


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_git_grep_picks_the_files_the_byte_tests_would(
    trees: dict[str, Path], release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git finds the words in one pass; without it every file is tested here, alike."""
    source = Source(trees[release] / "sglang")
    helpers = devices.helpers_of(source)
    if scanner._GitGrep(source).files() is None:
        pytest.skip("no git here: every file is tested in Python anyway")
    picked = scanner.Scan(source, helpers)
    picked.start()
    monkeypatch.setenv("PATH", "")  # no git to run
    assert scanner._GitGrep(source).files() is None
    every = scanner.Scan(source, helpers)
    every.start()
    picked_files = {(path, shown) for path, shown, _ in picked.jobs}
    every_files = {(path, shown) for path, shown, hits in every.jobs if hits is None}
    assert len(picked_files) < len(every_files) / 4  # most files hold none of the words
    for path, shown in every_files - picked_files:  # what git left out, the byte tests reject
        assert scanner.scan_bytes(Path(path).read_bytes(), shown, helpers) == [], shown
    assert picked.result() == every.result()


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_git_greps_lines_are_the_keyword_lines_python_finds(
    trees: dict[str, Path], release: str
) -> None:
    """File by file, the lines git grep reports give what the passes through the bytes give:
    the same keyword lines, the same files left unread, the same findings."""
    source = Source(trees[release] / "sglang")
    helpers = devices.helpers_of(source)
    hits = scanner._GitGrep(source).files()
    if hits is None:
        pytest.skip("no git here: every file is read in Python anyway")
    unread = 0
    for path, shown, _ in scanner._python_files(source):
        data = Path(path).read_bytes()
        starts, lines = candidates.Starts(data), scanner.lines_of(data.decode(errors="replace"))
        found = scanner.scan_bytes(data, shown, helpers)
        reported = hits.get(shown[len("sglang/") :])
        planned = scanner._planned(tuple(reported or ()))
        if planned is None:
            unread += reported is not None
            assert found == [], shown
            continue
        assert planned == candidates.keyword_lines(data, starts, lines), shown
        assert scanner.scan_bytes(data, shown, helpers, planned) == found, shown
    assert unread > 50  # files git reports that hold no gate: never read


GATE = "def pick(args):\n    if torch.cuda.get_device_capability()[0] == 10:\n"
GATE += '        args.backend = "trtllm"\n    return args\n'


@pytest.mark.parametrize(
    "before",
    ["", "# a form feed\x0c here\n", "# U+2028 \u2028 here\n", "# NEL \x85 here\n", "x = '\r'\n"],
    ids=["plain", "form-feed", "u2028", "nel", "lone-cr"],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_the_scan_with_git_finds_what_it_finds_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, newline: str
) -> None:
    """Lines are numbered by \\n on both ways (git's count), whatever else breaks a line for
    `str.splitlines`; a repository's `grep.column` does not change git's output."""
    package = tmp_path / "repo" / "sglang"
    text = ("import torch\n" + before + "\n" + GATE).replace("\n", newline)
    (package / "srt").mkdir(parents=True)
    (package / "srt" / "a.py").write_bytes(text.encode())
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "config", "grep.column", "true"], check=True
    )
    source = Source(package)
    helpers = devices.helpers_of(source)
    if scanner._GitGrep(source).files() is None:
        pytest.skip("no git here")
    with_git = scanner.scan(source, helpers)
    monkeypatch.setenv("PATH", "")
    assert scanner._GitGrep(source).files() is None
    without = scanner.scan(Source(package), helpers)
    assert with_git == without
    assert [f.line for f in with_git] == [text.count("\n", 0, text.index("if torch")) + 1]


def test_git_grep_that_names_files_from_the_repository_top_is_not_used(tmp_path: Path) -> None:
    """grep.fullName (an editable checkout's repository may set it) or an old git that reads
    the user's config: names not relative to the package mean git's answer is dropped."""
    package = tmp_path / "repo" / "python" / "sglang"
    write(package / "srt" / "a.py", "if is_sm100_supported():\n    a = 1\n")
    write(package / "srt" / "b.py", "a = 1\n")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "config", "grep.fullName", "true"], check=True)
    grep = scanner._GitGrep(Source(package))
    found = grep.files()  # --no-full-name wins over the repository's config
    assert found == {"srt/a.py": [(1, b"if is_sm100_supported():")]}
    assert scanner._GitGrep(Source(package)).root == package
    grep = scanner._GitGrep(Source(package))
    assert grep.process is not None
    grep.root = tmp_path  # as if git had named the files from somewhere else
    assert grep.files() is None
    grep = scanner._GitGrep(Source(package))
    grep.root = tmp_path
    assert grep.files({"srt/b.py"}) is None  # the listing names other files: still looked up
    grep = scanner._GitGrep(Source(package))
    grep.root = tmp_path
    assert grep.files({"srt/a.py"}) == found  # a file the listing found is not looked up again


@pytest.mark.wheel
@needs_pool
def test_a_scan_whose_pool_cannot_start_runs_here(
    trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Source(trees[SEED] / "sglang")
    expected = scanner.scan(source, devices.helpers_of(source))

    def no_process(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_process)
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is None
        assert shared.result() == expected


@pytest.mark.wheel
@needs_pool
def test_a_scan_whose_workers_die_finishes_in_the_caller(trees: dict[str, Path]) -> None:
    source = Source(trees["0.5.23"] / "sglang")
    expected = scanner.scan(source, devices.helpers_of(source))
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is not None
        for process in workers.executor._processes.values():
            os.kill(process.pid, signal.SIGKILL)  # BrokenProcessPool: the rest is scanned here
        assert shared.result() == expected


@pytest.mark.wheel
@needs_pool
def test_a_scan_left_early_stops_its_workers(trees: dict[str, Path]) -> None:
    source = Source(trees[SEED] / "sglang")
    with pytest.raises(KeyError), pool.Pool() as workers:  # the work beside the scan raised
        started_scan(source, workers)
        assert workers.executor is not None
        processes = list(workers.executor._processes.values())
        raise KeyError("the EAGLE-3 side")
    assert workers.executor is None
    assert not any(_alive(p.pid) for p in processes)


def _alive(pid: int) -> bool:
    """Still running, or a zombie nobody reaped."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


@pytest.mark.wheel
def test_an_exact_capability_helper_parts_12_0_from_12_1(trees: dict[str, Path]) -> None:
    """0.5.23's `is_sm121()` compares the capability to (12, 1): GB10 alone, not 12.0 (its
    name's digits would say major 12, both parts); `is_sm120()` excludes GB10."""
    helpers = devices.helpers_of(Source(trees["0.5.23"] / "sglang"))
    assert helpers["is_sm121"] == {(12, 1)} and helpers["is_sm120"] == {(12, 0)}
    evaluator = Evaluator(helpers, {}, {}, frozenset())
    for name, on in (("is_sm121", devices.GB10), ("is_sm120", devices.RTX_BLACKWELL)):
        test = ast.parse(f"{name}()", mode="eval").body
        truths = {device: evaluator.truth(test, device, True) for device in devices.DEVICES}
        assert truths == {device: device == on for device in devices.DEVICES}, name
    assert devices.helpers_of(Source(trees[SEED] / "sglang"))["is_sm100_supported"] == {10}
