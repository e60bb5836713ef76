"""One libcst parse, and one cut, per distinct source in a test process.

`sglpatch.engine.parse` is a function of the bytes alone, and nothing changes what it returns in
place: a libcst Module's nodes are frozen dataclasses holding tuples, a syntax error is a string,
and the engine itself runs every patch of a file over one parse (`engine.transform_module`). Yet
the tests parse the same wheel members again and again (0.5.9's targets in every CLI test): of
4766 parses in the test processes, 3768 were of bytes the same process had parsed before, some
430 of the suite's 1120 CPU seconds (measured 2026-12-01). The conftest serves those repeats
from here; every distinct source is still parsed by libcst. Programs the tests start (`python -m
sglpatch`) parse for themselves.

`sglpatch.elision.elide` (the part of a file its patches read, found with `ast`) is shared the
same way: its answer is a function of the bytes and the names read, and an `Elided` holds only
bytes. test_reads and the matrix cut each release's files twice or more (py-spy, 2026-12-02).

`afresh()` turns the sharing off where a run's timing is itself sampled (a SIGINT at a random
moment of an in-process apply must land in the real parse as often as it does for a user).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator
from typing import Any

# Bytes of source whose parses are kept (the trees take some 60 times that): a release's patch
# targets are 0.6-1.2 MB, so the seed's and the few releases a module works on stay in.
BUDGET = 6_000_000
# A cut holds about twice its source: every release's patch targets (some 40 MB) stay in.
CUTS_BUDGET = 64_000_000


class SharedParses:
    """`parse` with the results of the most recently used sources kept (least recent dropped)."""

    def __init__(self, parse: Callable[..., Any], budget: int = BUDGET) -> None:
        self._parse = parse
        self._budget = budget
        self._held = 0
        self._kept: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()  # key: (result, size)
        self.sharing = True

    def __call__(self, source: bytes) -> Any:
        if not self.sharing or type(source) is not bytes:
            return self._parse(source)
        return self._shared(source, source, (source,))

    def _shared(self, key: Hashable, source: str | bytes, args: tuple[Any, ...]) -> Any:
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key][0]
        parsed = self._parse(*args)  # an interrupt here keeps nothing
        if len(source) <= self._budget:
            self._kept[key] = (parsed, len(source))
            self._held += len(source)
            while self._held > self._budget:
                dropped, (result, size) = self._kept.popitem(last=False)
                self._held -= size
                self._dropped(dropped, result)
        return parsed

    def _dropped(self, key: Hashable, result: Any) -> None:
        """Called with what leaves the cache (a subclass checks it)."""


class SharedCuts(SharedParses):
    """`elide(source, reads)` with its answers for the most recent sources and names kept."""

    def __call__(self, source: bytes, reads: Collection[str]) -> Any:  # type: ignore[override]
        if not self.sharing or type(source) is not bytes:
            return self._parse(source, reads)
        return self._shared((source, frozenset(reads)), source, (source, reads))


_shared: list[SharedParses] = []


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """`engine.parse` and `elision.elide` share their results while this lasts (the conftest
    holds it for the session)."""
    from sglpatch import elision, engine

    parse, elide = engine.parse, elision.elide
    _shared[:] = [SharedParses(parse), SharedCuts(elide, CUTS_BUDGET)]
    engine.parse, elision.elide = _shared  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.parse, elision.elide = parse, elide
        _shared.clear()


@contextlib.contextmanager
def afresh() -> Iterator[None]:
    """Every parse and cut in this block runs as it does outside the tests."""
    before = [one.sharing for one in _shared]
    for one in _shared:
        one.sharing = False
    try:
        yield
    finally:
        for one, sharing in zip(_shared, before, strict=True):
            one.sharing = sharing
