"""What the scanner reports: one capability decision and what capability-12 GPUs get there."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Word(str, Enum):
    """An enum whose members read as their words, in text as in JSON."""

    def __str__(self) -> str:
        return str(self.value)


class Kind(Word):
    """How capability 12 comes to what it gets at a decision (`gates` says how each is told)."""

    EXCLUDES = "excludes"  # 12 takes a branch 10 does not reach
    SHARES = "shares"  # a range or family test groups 12 with 10, apart from 8
    DECIDES = "decides"  # a test that decides for 12 as for 10
    TABLE = "table"  # a table keyed by capability without a row for 12
    REFUSAL = "refusal"  # 12 is refused with an error, by design


class Chosen(NamedTuple):
    """What a device's branch chooses, as the kernel-support table names it."""

    device: str  # "12.0"
    kind: str  # the table's kind: attention, dsa, moe, gemm, comm
    name: str  # the table's record name
    via: str  # the flag or entry point that chose it
    opt_in: str  # the user's flag that path needs; "" when it is taken by default


class Finding(NamedTuple):
    file: str  # sglang/...
    line: int
    kind: Kind
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
        return tuple(c for c in self.choices if c.device == device)
