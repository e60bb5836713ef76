"""The cyclic garbage collector, paused while sglpatch builds syntax trees."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused(*, settle: bool = False) -> Iterator[None]:
    """No collector passes inside: parsing builds a few million short-lived objects (libcst's and
    ast's trees, which hold no cycles), and the passes over them cost a tenth of doctor's time
    and of a dry run's. Refcounting still frees every tree. Nested, only the outermost resumes.

    With `settle`, what is left alive at the end goes to the oldest generation untraversed
    (doctor's report): turned back on, the collector's first pass would otherwise walk all of it
    at the caller's next step. Without it, the young stay young, their cycles collected as ever.
    Only when nothing was frozen before: `gc.unfreeze` cannot tell the caller's frozen objects
    from ours, and would hand every one of them back to the collector (a host process that froze
    its heap before forking, a test session that froze its shared trees: seconds per full pass).
    """
    collecting = gc.isenabled()
    settle = settle and gc.get_freeze_count() == 0
    gc.disable()  # a process forked in here (doctor's workers) starts with it off too
    try:
        yield
    finally:
        if collecting:
            if settle:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
