"""What happened to each patch: plain values passed from the engine up to the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.version import Version


@dataclass(frozen=True)
class Applied:
    """The patch changed its file (or, in a dry run, would)."""

    patch_id: str
    file: str
    state = "applied"


@dataclass(frozen=True)
class AlreadyApplied:
    """The change is already there: sglpatch put it there, or upstream shipped it."""

    patch_id: str
    file: str
    by: Literal["sglpatch", "upstream"]
    detail: str
    fixed_in: Version | None = None

    @property
    def state(self) -> str:
        return "already applied" if self.by == "sglpatch" else "already upstream"


@dataclass(frozen=True)
class NotApplicable:
    """The release has nothing for this patch to fix (the file or feature does not exist)."""

    patch_id: str
    reason: str
    state = "not for this release"


@dataclass(frozen=True)
class Failed:
    """The patch cannot be applied; nothing is written when any patch fails."""

    patch_id: str
    file: str | None
    reason: str
    state = "failed"


Outcome = Applied | AlreadyApplied | NotApplicable | Failed
