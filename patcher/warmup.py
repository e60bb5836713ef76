"""doctor's codemods, warmed up in a second process while the CLI itself starts.

doctor runs the catalogue in memory to know which patches still have work, and importing libcst
for that takes more CPU (0.15 s) than the CLI's whole start, during which the second core is
idle. So `start()`, called first thing by `sglpatch doctor`, forks a process that imports libcst
and the catalogue at once, then waits for its job: `submit()` sends it the target and catalogue,
`checks()` takes back what `coverage.check` found. The process imports nothing before it forks,
writes nothing but its answer, and ends when the CLI does; whatever goes wrong with it, the CLI
runs the checks itself.

doctor's other child processes (the scan's worker, `git grep`) are tracked here too: no child
outlives doctor. A SIGTERM or SIGHUP of doctor kills and reaps them before doctor dies of that
signal, Ctrl-C's cleanup and `atexit` stop them, and each forked child asks the kernel to kill it
when doctor dies (SIGKILL included).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

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
        child_started()
        os.close(jobs)
        os.close(answers)
        code = 1
        try:
            _serve(jobs_in, answers_out)
            code = 0
        finally:
            os._exit(code)  # no atexit, no flushing of the CLI's buffers
    track(pid)
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
    untrack(_worker.pid)
    _worker = None


# doctor's live child processes, and the signal handlers `track` replaced (restored once none
# is left, so a library caller gets its own back).
_children: set[int] = set()
_replaced: dict[int, Any] = {}
_ENDING = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


def track(pid: int) -> None:
    """A child process started: it is killed if doctor is terminated, or ends, before it."""
    if not _children and not _replaced:
        for signum in _ENDING:
            with contextlib.suppress(ValueError, OSError):  # not the main thread: atexit only
                _replaced[signum] = signal.signal(signum, _end_children)
    _children.add(pid)


def untrack(pid: int) -> None:
    """A child process was stopped and reaped."""
    _children.discard(pid)
    if not _children:
        for signum, handler in _replaced.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)
        _replaced.clear()


def _kill_children() -> None:
    for pid in list(_children):
        with contextlib.suppress(OSError):  # gone already, or reaped by its owner
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
        _children.discard(pid)


atexit.register(_kill_children)


def _end_children(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP of doctor: kill and reap its children, then die of the signal (its
    caller sees 128 + signum, as for any process a signal ends)."""
    _kill_children()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the default action ends the process


def child_started() -> None:
    """In a child doctor forked: its parent's handlers and children are not its own, and it dies
    with its parent, however the parent ends (Linux; elsewhere `track` and atexit do it)."""
    parent = os.getppid()
    for signum in _replaced:
        signal.signal(signum, signal.SIG_DFL)
    _replaced.clear()
    _children.clear()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no libc to ask: the parent's handlers remain
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


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
