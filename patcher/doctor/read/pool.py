"""doctor's helper processes: a `ProcessPoolExecutor` (fork) when there is a second core and a tree
large enough to share, the caller's own process otherwise.

Work is handed over as `Task`s, which the workers take in the order given while the caller does
its own part. Whatever goes wrong in a worker (it died, its answer cannot be pickled, its code
raised) makes the task's `result()` run it here: a dead worker loses none of the work it had not
finished, and an error is raised here with its own context, as if there had been no pool. The
caller waits rather than working beside the workers: a busy caller holds the GIL that its pool's
threads need to hand the workers their next task.

No child outlives doctor. While the pool is open, a SIGTERM or SIGHUP of doctor kills and reaps
its workers (and the processes given to `track`, such as `git grep`) before doctor dies of that
signal; Ctrl-C, or any error, shuts the pool down with its queued work cancelled and its workers
killed; and on Linux each worker asks the kernel to kill it when doctor dies, SIGKILL included.
Workers ignore Ctrl-C (the caller handles it) and write nothing to doctor's output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

SMALL = 200  # `.py` files: a tree with fewer is scanned here faster than a pool starts
_MOST_WORKERS = 4  # doctor's work is under a second of CPU: more processes cost more than they save
_ENDING = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
_JOIN_S = 5.0  # how long a closing pool waits for the thread that reaps its killed workers


def usable_cores() -> int:
    """The cores this process may run on (its affinity), not all the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Task(Generic[T]):
    """`fn(*args)`, in a worker or here."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], future: Future[T] | None):
        self.fn = fn
        self.args = args
        self.future = future

    def result(self) -> T:
        if self.future is not None:
            future, self.future = self.future, None
            with contextlib.suppress(Exception):  # cancelled, a dead worker, its error: here
                return future.result()
        return self.fn(*self.args)


class Pool:
    """A context manager; `start()` opens the processes, and without it every task runs here."""

    def __init__(self) -> None:
        self.executor: ProcessPoolExecutor | None = None
        self.size = 0  # worker processes open (0: every task runs here)
        self._tracked: set[subprocess.Popen[bytes]] = set()
        self._replaced: dict[int, Any] = {}
        self._owner = os.getpid()
        # After `finish`: the thread that ends the workers, and the workers, for `close`.
        self._ending: tuple[threading.Thread | None, list[Any]] | None = None

    def __enter__(self) -> Pool:
        for signum in _ENDING:
            with contextlib.suppress(ValueError, OSError):  # not the main thread: no handler
                self._replaced[signum] = signal.signal(signum, self._end)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close(wait=kind is None)
        finally:
            for signum, handler in self._replaced.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(signum, handler)
            self._replaced.clear()

    def start(self, files: int) -> bool:
        """Open the worker processes for a tree of `files` `.py` files, if it is worth it."""
        cores = usable_cores()
        if self.executor is not None or cores < 2 or files < SMALL:
            return self.executor is not None
        import multiprocessing

        size = min(cores, _MOST_WORKERS)
        with contextlib.suppress(ValueError, OSError, ImportError, NotImplementedError):
            self.executor = ProcessPoolExecutor(
                max_workers=size,
                mp_context=multiprocessing.get_context("fork"),  # the loaded modules, shared
                initializer=_worker_started,
                initargs=(os.getpid(),),
            )
            self.size = size
        return self.executor is not None

    def run(self, fn: Callable[..., T], *args: Any) -> Task[T]:
        """`fn(*args)` as a task: handed to a worker if the pool is open, else run on `result()`."""
        future = None
        if self.executor is not None:
            try:
                with _ctrl_c_held():  # the first task forks the workers
                    future = self.executor.submit(fn, *args)
            except (RuntimeError, OSError):  # broken, or no process to spare: run here
                future = None
        return Task(fn, args, future)

    def track(self, process: subprocess.Popen[bytes]) -> None:
        """A process doctor started beside the pool: killed with the workers on a signal."""
        self._tracked.add(process)

    def untrack(self, process: subprocess.Popen[bytes]) -> None:
        self._tracked.discard(process)

    def finish(self) -> None:
        """No more tasks: the workers are told to end now, and `close` waits for them (each
        worker's exit, its memory given back, takes a few milliseconds the caller can use)."""
        executor = self.executor
        if executor is not None and self._ending is None:
            # shutdown forgets the thread that ends the workers, and the workers
            thread: threading.Thread | None = getattr(executor, "_executor_manager_thread", None)
            self._ending = (thread, list(executor._processes.values()))
            executor.shutdown(wait=False)

    def close(self, *, wait: bool = True) -> None:
        """End the workers: let them finish (`wait`), or cancel their work and kill them."""
        for process in list(self._tracked):  # not waited for: an error came first
            with contextlib.suppress(OSError):
                process.kill()
                process.wait()
            self._tracked.discard(process)
        executor, self.executor, self.size = self.executor, None, 0
        ending, self._ending = self._ending, None
        if ending is not None:
            thread, processes = ending
            if wait and thread is not None:
                thread.join()  # it reaps the workers
        elif executor is not None:
            processes = list(executor._processes.values())  # shutdown forgets them
            thread = getattr(executor, "_executor_manager_thread", None)
            if wait:
                executor.shutdown(wait=True)
            else:
                executor.shutdown(wait=False, cancel_futures=True)
        else:
            return
        _kill(processes)  # reaped already after a shutdown that waited; any left, here
        if not wait and thread is not None:
            # Its workers are dead, so it ends at once. Left running, it may close its wakeup
            # pipe while Python's exit hook writes to it: "Exception ignored ... Bad file
            # descriptor" after a Ctrl-C (CPython 3.11's concurrent.futures).
            thread.join(timeout=_JOIN_S)

    def _end(self, signum: int, frame: object) -> None:
        """SIGTERM or SIGHUP: kill and reap the children, then die of the signal (the caller
        sees what it sees for any process a signal ends)."""
        if os.getpid() == self._owner:  # not in a worker forked before its handlers were reset
            executor = self.executor
            if self._ending is not None:
                _kill(self._ending[1])
            elif executor is not None:
                _kill(list(executor._processes.values()))
            for process in list(self._tracked):
                with contextlib.suppress(OSError):
                    process.kill()
                    process.wait()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum)  # not reached: the default action ends the process


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C back while workers may be forked; one that came meanwhile lands after.

    Python runs its at-fork callbacks (logging's among them) where a KeyboardInterrupt can
    only be printed, with a traceback, and forgotten; and a worker must not die of a Ctrl-C
    (a terminal's reaches every process in its group) before its initializer ignores it.
    """
    if not hasattr(signal, "pthread_sigmask"):  # no fork there either
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _kill(processes: list[Any]) -> None:
    for process in processes:
        with contextlib.suppress(OSError, ValueError):  # gone already, or closed
            process.kill()
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join()


def _worker_started(parent: int) -> None:
    """In each worker, first: doctor's handlers are not its own, it writes nothing to doctor's
    output (a plugin's print must not reach the user twice), and it dies with doctor however
    doctor ends (Linux; elsewhere the parent's handlers and `close` do it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    if hasattr(signal, "pthread_sigmask"):  # forked with it held back (`_ctrl_c_held`)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    for signum in _ENDING:
        signal.signal(signum, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no libc to ask: the parent's handlers remain
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # doctor died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = sys.stderr = Path(os.devnull).open("w")  # noqa: SIM115 - the worker's to its end
