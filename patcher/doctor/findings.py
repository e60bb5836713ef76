"""What the scanner reports: one capability gate and what capability 12 gets there."""

from __future__ import annotations

from typing import NamedTuple


class Finding(NamedTuple):
    file: str  # sglang/...
    line: int
    kind: str  # excludes, shares, table or refusal
    code: str  # the line of the deciding test
    gets: str  # what capability 12 gets there
    like: str  # what capability 10 gets there

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity across an edit that moves lines: a patch covers a finding it removes."""
        return (self.file, self.kind, self.code, self.gets)
