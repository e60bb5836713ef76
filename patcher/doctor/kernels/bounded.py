"""A program run as a probe: bounded in time and in output, and never outliving doctor.

The probe runs in its own session (so its process group is its own to kill) and its output is
read here, from a non-blocking pipe, until the probe itself ends, the time is up, or it printed
more than `MOST_BYTES`. Then its group is killed and the pipe closed without waiting for the
end of the output: a process that left the group (`setsid`) may hold the pipe open forever,
and is not waited for (nor reached: it lives on, its writes to the closed pipe failing).

The probe dies with doctor: a SIGTERM or SIGHUP of doctor kills the probe's group before doctor
dies of it, Ctrl-C (or any error) kills the group on the way out, and on Linux the kernel kills
the probe itself when doctor dies, SIGKILL included (what the probe started beside it is left
then: ptxas and nvcc start nothing for `--version` and `--help`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

MOST_BYTES = 1 << 20  # nvcc 13.0's `--help` is 52 KB: a probe printing more is broken
_CHUNK = 1 << 16
_POLL_S = 0.01  # how often its end is looked for where the kernel cannot say (no pidfd)
_REAP_S = 2.0  # a killed probe not reaped by then is stuck in the kernel: left to Popen
_ENDING = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


class Ran(NamedTuple):
    """What a probe printed (stdout and stderr), and how it ended."""

    output: bytes
    returncode: int | None  # None: it was killed at a bound
    over: str  # "" when it ended by itself; "time" or "output": the bound it was killed at


def run(argv: Sequence[str], environ: Mapping[str, str], seconds: float) -> Ran:
    """Run `argv` with no input for at most `seconds`, keeping at most `MOST_BYTES` of its output.

    Raises OSError when it cannot be started, as `subprocess.Popen` does.
    """
    deadline = time.monotonic() + seconds
    with _killed_on_ending() as running:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(environ),
            start_new_session=True,
            preexec_fn=_dying_with_parent(),
        )
        running.append(proc)
        try:
            output, over = _read(proc, deadline)
        finally:
            _kill(proc)
            running.remove(proc)  # reaped next: then its number may be another's
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_REAP_S)
    return Ran(output, None if over else proc.returncode, over)


def _read(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, str]:
    """Its output until it ends (then what it wrote before that), the deadline, or the cap."""
    fd = _stdout(proc).fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    with contextlib.ExitStack() as stack:
        selector = stack.enter_context(selectors.DefaultSelector())
        selector.register(fd, selectors.EVENT_READ)
        pidfd = _pidfd(proc.pid)
        if pidfd is not None:  # readable once the probe ended: no polling for that
            stack.callback(os.close, pidfd)
            selector.register(pidfd, selectors.EVENT_READ)
        reading = True
        while True:
            # Ended first, read then: all it wrote is in the pipe by now. What a process it
            # left behind writes later is not waited for.
            ended = _ended(proc)
            while reading:
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    selector.unregister(fd)
                    reading = False
                    break
                chunks.append(data)
                size += len(data)
                if size > MOST_BYTES:
                    return b"".join(chunks)[:MOST_BYTES], "output"
            if ended:
                return b"".join(chunks), ""
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), "time"
            if pidfd is not None:
                selector.select(left)
            elif reading:
                selector.select(min(left, _POLL_S))
            else:  # its output ended, and nothing here says when it does
                time.sleep(min(left, _POLL_S))


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the probe ended, without reaping it: its number stays its group's until `_kill`
    kills that group, so no other process can have taken it."""
    if not hasattr(os, "waitid"):  # macOS before Python 3.13: reaped, as Popen does
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped by another (SIGCHLD ignored)
        return True


def _pidfd(pid: int) -> int | None:
    """A descriptor that polls readable when `pid` ends (Linux 5.3 and later), or None."""
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill its group (the probe unreaped, so the group is still its), and close the pipe
    whoever still holds it."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    _stdout(proc).close()


def _stdout(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    if proc.stdout is None:  # started with stdout=PIPE: never
        raise RuntimeError("a probe started without its output pipe")
    return proc.stdout


@contextlib.contextmanager
def _killed_on_ending() -> Iterator[list[subprocess.Popen[bytes]]]:
    """While inside, a SIGTERM or SIGHUP of doctor kills the probes' groups, then does what it
    did before (doctor's pool's handler, or dying of it)."""
    running: list[subprocess.Popen[bytes]] = []
    replaced: dict[int, Any] = {}

    def end(signum: int, frame: Any) -> None:
        for proc in running:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        before = replaced.get(signum)
        if callable(before):
            before(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum)  # not reached: the default action ends the process

    for ending in _ENDING:
        if signal.getsignal(ending) == signal.SIG_IGN:  # nohup: doctor lives on, so does it
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main thread: no handler
            replaced[ending] = signal.signal(ending, end)
    try:
        yield running
    finally:
        for number, handler in replaced.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(number, handler)


def _dying_with_parent() -> Callable[[], None] | None:
    """On Linux, what the child runs before the probe: the kernel kills it when doctor dies.

    None elsewhere, or while doctor has other threads: between fork and exec the child must
    take no lock another thread may hold (subprocess's warning for `preexec_fn`); what it runs
    here is one system call through a function made before the fork.
    """
    request = _death_signal_request()
    if request is None or threading.active_count() > 1:
        return None
    parent = os.getpid()

    def in_child() -> None:
        request()
        if os.getppid() != parent:  # doctor died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


@functools.cache
def _death_signal_request() -> Callable[[], object] | None:
    """`prctl(PR_SET_PDEATHSIG, SIGKILL)`, ready to call; None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None
    pr_set_pdeathsig = 1
    # The kernel reads the arguments as unsigned longs.
    args = [ctypes.c_ulong(v) for v in (signal.SIGKILL, 0, 0, 0)]
    return functools.partial(prctl, pr_set_pdeathsig, *args)
