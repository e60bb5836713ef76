"""One libcst parse per distinct source in a test process.

`sglpatch.engine.parse` is a function of the bytes alone, and nothing changes what it returns in
place: a libcst Module's nodes are frozen dataclasses holding tuples, a syntax error is a string,
and the engine itself runs every patch of a file over one parse (`engine.transform_module`). Yet
the tests parse the same wheel members again and again (0.5.9's targets in every CLI test): of
4766 parses in the test processes, 3768 were of bytes the same process had parsed before, some
430 of the suite's 1120 CPU seconds (measured 2026-12-01). The conftest serves those repeats
from here; every distinct source is still parsed by libcst. Programs the tests start (`python -m
sglpatch`) parse for themselves.

`afresh()` turns the sharing off where a run's timing is itself sampled (a SIGINT at a random
moment of an in-process apply must land in the real parse as often as it does for a user).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

# Bytes of source whose parses are kept (the trees take some 60 times that): a release's patch
# targets are 0.6-1.2 MB, so the seed's and the few releases a module works on stay in.
BUDGET = 6_000_000


class SharedParses:
    """`parse` with the results of the most recently used sources kept (least recent dropped)."""

    def __init__(self, parse: Callable[[bytes], Any], budget: int = BUDGET) -> None:
        self._parse = parse
        self._budget = budget
        self._held = 0
        self._kept: OrderedDict[bytes, Any] = OrderedDict()
        self.sharing = True

    def __call__(self, source: bytes) -> Any:
        if not self.sharing or type(source) is not bytes:
            return self._parse(source)
        if source in self._kept:
            self._kept.move_to_end(source)
            return self._kept[source]
        parsed = self._parse(source)  # an interrupt here keeps nothing
        if len(source) <= self._budget:
            self._kept[source] = parsed
            self._held += len(source)
            while self._held > self._budget:
                dropped, _ = self._kept.popitem(last=False)
                self._held -= len(dropped)
        return parsed


_shared: SharedParses | None = None


@contextlib.contextmanager
def shared() -> Iterator[SharedParses]:
    """`engine.parse` shares its results while this lasts (the conftest holds it for the session)."""
    global _shared
    from sglpatch import engine

    original = engine.parse
    _shared = SharedParses(original)
    engine.parse = _shared  # type: ignore[assignment]
    try:
        yield _shared
    finally:
        engine.parse = original  # type: ignore[assignment]
        _shared = None


@contextlib.contextmanager
def afresh() -> Iterator[None]:
    """Every parse in this block runs libcst, as outside the tests."""
    if _shared is None:
        yield
        return
    before, _shared.sharing = _shared.sharing, False
    try:
        yield
    finally:
        _shared.sharing = before
