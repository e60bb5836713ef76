"""Calling code that must not wait on a FIFO, without the test waiting forever if it does."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def without_waiting(fifo: Path, call: Callable[[], T], seconds: float = 20) -> T:
    """`call()`'s answer; the test fails if `call` is still waiting on `fifo` after `seconds`.

    It runs in a thread: one that waits is let go by opening the FIFO's other end (its open
    then returns, and it reads the end of the file), so the test session ends.
    """
    answer: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(call())
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for flags in (os.O_WRONLY, os.O_RDONLY):  # whichever end the waiting open lacks
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"waited on the FIFO {fifo}")
    if raised:
        raise raised[0]
    return answer[0]
