"""What the scanner reports: one capability decision and what capability-12 GPUs get there."""

from __future__ import annotations

from typing import NamedTuple

# What a device's branch chooses: (device "12.0", table kind, record name, the flag or entry
# point that chose it, the user's flag that path needs or "" when it is taken by default).
Chosen = tuple[str, str, str, str, str]


class Finding(NamedTuple):
    file: str  # sglang/...
    line: int
    kind: str  # excludes, shares, decides, table or refusal
    code: str  # the line of the deciding test
    gets: str  # what capability 12.0 gets there
    like: str  # what capability 10 gets there
    head: int = 0  # the decision's first line (the chain's `if`); 0: `line`
    choices: tuple[Chosen, ...] = ()  # what 12.0, 12.1 and 10.0 choose there (`branches`)
    gets_121: str = ""  # what 12.1 gets, when it is not what 12.0 gets

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity across an edit that moves lines: a patch covers a finding it removes."""
        return (self.file, self.kind, self.code, self.gets)

    def chosen(self, device: str) -> tuple[Chosen, ...]:
        return tuple(c for c in self.choices if c[0] == device)
