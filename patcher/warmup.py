"""doctor's codemods, warmed up in a second process while the CLI itself starts.

doctor runs the catalogue in memory to know which patches still have work, and importing libcst
for that takes more CPU (0.15 s) than the CLI's whole start, during which the second core is
idle. So `start()`, called first thing by `sglpatch doctor`, forks a process that imports libcst
and the catalogue at once, then waits for its job: `submit()` sends it the target and catalogue,
`checks()` takes back what `coverage.check` found. The process imports nothing before it forks,
writes nothing but its answer, and ends when the CLI does; whatever goes wrong with it, the CLI
runs the checks itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from packaging.version import Version

    from sglpatch.doctor.coverage import PatchCheck
    from sglpatch.patch import Patch


class _Worker(NamedTuple):
    pid: int
    jobs: int  # the pipe the CLI writes the job to
    answers: int  # the pipe the worker writes its answer to


_worker: _Worker | None = None
_submitted = False


def start(args: Sequence[str]) -> None:
    """Fork the worker if the command is doctor and a second core can run it."""
    global _worker
    if _worker is not None or args[:1] != ["doctor"] or not hasattr(os, "fork"):
        return
    if usable_cores() < 2:
        return
    pipes: list[int] = []
    try:
        jobs_in, jobs = os.pipe()
        pipes += (jobs_in, jobs)
        answers, answers_out = os.pipe()
        pipes += (answers, answers_out)
        pid = os.fork()
    except OSError:  # no pipe or process to spare: the CLI checks alone
        for fd in pipes:
            os.close(fd)
        return
    if pid == 0:  # the worker: never returns
        os.close(jobs)
        os.close(answers)
        code = 1
        try:
            _serve(jobs_in, answers_out)
            code = 0
        finally:
            os._exit(code)  # no atexit, no flushing of the CLI's buffers
    os.close(jobs_in)
    os.close(answers_out)
    _worker = _Worker(pid, jobs, answers)


def running() -> bool:
    return _worker is not None


def usable_cores() -> int:
    """The cores this process may run on (its affinity), not all the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def submit(package_dir: Path, release: Version, catalog: Path | None) -> None:
    """Hand the worker its job; it answers once libcst is loaded."""
    global _submitted
    worker = _worker
    if worker is None:
        return
    import pickle

    try:
        os.write(worker.jobs, pickle.dumps((str(package_dir), str(release), catalog)))
        _submitted = True
    except OSError:  # it died: the CLI checks alone
        stop()
    finally:
        with contextlib.suppress(OSError):
            os.close(worker.jobs)  # the end of the job


def checks(patches: Sequence[Patch]) -> list[PatchCheck] | None:
    """The worker's answer, on these patches; None if it has none (the caller checks itself)."""
    if _worker is None or not _submitted:
        return None
    import pickle

    try:
        with os.fdopen(_worker.answers, "rb", closefd=False) as answers:
            answer = pickle.load(answers)
    except (EOFError, OSError, pickle.UnpicklingError):
        return None
    finally:
        stop()
    from sglpatch.doctor.coverage import PatchCheck

    by_id = {patch.id: patch for patch in patches}
    if not isinstance(answer, list) or any(row[0] not in by_id for row in answer):
        return None
    return [PatchCheck(by_id[pid], file, outcome, after) for pid, file, outcome, after in answer]


def stop() -> None:
    """Stop the worker: its answer was taken, or will not be (the command ended otherwise)."""
    global _worker, _submitted
    _submitted = False
    if _worker is None:
        return
    with contextlib.suppress(OSError):
        os.close(_worker.answers)
    with contextlib.suppress(OSError):  # it may be gone already
        os.kill(_worker.pid, signal.SIGKILL)
        os.waitpid(_worker.pid, 0)
    _worker = None


def _serve(jobs: int, answers: int) -> None:
    """The worker: load libcst, wait for the job, answer it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the CLI's to handle
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # a plugin's print must not reach the user twice
        os.dup2(devnull, fd)
    import pickle
    from pathlib import Path

    import libcst  # noqa: F401 - the point: loaded while the CLI starts
    from packaging.version import Version

    from sglpatch import catalogue
    from sglpatch.doctor import coverage

    with os.fdopen(jobs, "rb") as job:
        data = job.read()
    if not data:
        return  # the CLI did not need us
    package_dir, release, catalog = pickle.loads(data)
    found = coverage.check(Path(package_dir), Version(release), catalogue.load(catalog))
    rows = [(c.patch.id, c.file, c.outcome, c.after) for c in found]
    with os.fdopen(answers, "wb") as out:
        out.write(pickle.dumps(rows))
