"""What each patch's test module declares for `tests/test_matrix.py` (every release, every patch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.version import Version

# The patched (or pristine) wheel members of one release, keyed by wheel path ("sglang/srt/...").
Members = Mapping[str, bytes]


@dataclass(frozen=True)
class MatrixHooks:
    """`tests/patches/test_<module>.py` sets `MATRIX = MatrixHooks(...)`.

    - `expected(release)`: "applied", "already upstream" or "not for this release", read off the
      wheels by hand;
    - `effect(release, patched)`: asserts the patch's effect on a release where it was applied or
      is upstream;
    - `symptom(release, pristine)`, optional: asserts the bug is real on an unpatched release
      where the patch applies.
    """

    expected: Callable[[Version], str]
    effect: Callable[[Version, Members], None]
    symptom: Callable[[Version, Members], None] | None = None
