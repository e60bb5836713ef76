"""The values the API returns to the CLI (and to anyone scripting sglpatch).

NamedTuples rather than dataclasses: a dozen frozen dataclasses cost every command about ten
milliseconds to define at start-up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sglpatch.results import Failed, Outcome
from sglpatch.target import Target

if TYPE_CHECKING:
    from sglpatch.doctor import Diagnosis, KernelFinding
    from sglpatch.store.state import Entry


# Every state a patch can be in (apply's outcomes and status's rows), in the order counts list them.
STATES = (
    "applied",
    "already applied",
    "patched",
    "not applied",
    "edited since applied",
    "skipped",
    "failed",
    "already upstream",
    "not for this release",
    "unknown",
)


def tally(states: Iterable[str]) -> dict[str, int]:
    """How many patches are in each state, in the order of `STATES`; states with none left out."""
    seen = Counter(states)
    return {
        state: seen[state] for state in (*STATES, *sorted(set(seen) - set(STATES))) if seen[state]
    }


class ApplyReport(NamedTuple):
    target: Target
    ledger: Path
    outcomes: tuple[Outcome, ...]
    diff: str
    changed: tuple[str, ...]
    written: bool
    commit: str | None
    untested: tuple[str, ...]  # patches run outside their tested releases (--force)
    finished: str | None = None  # an interrupted apply or revert that this run completed first

    @property
    def failures(self) -> list[Failed]:
        return [o for o in self.outcomes if isinstance(o, Failed)]


class RevertReport(NamedTuple):
    target: Target
    ledger: Path
    restored: tuple[str, ...]
    untouched: tuple[str, ...]  # already back to the original bytes (e.g. after a reinstall)
    saved_edits: tuple[str, ...]  # edited files whose bytes --force kept in the ledger
    commit: str | None
    finished: str | None = None
    left: tuple[str, ...] = ()  # no longer regular files (a directory): --force leaves them
    patches: tuple[str, ...] = ()  # the patches this revert took off the target


class PatchStatus(NamedTuple):
    id: str
    # applied, not applied, already upstream, not for this release, edited since applied,
    # patched (bytes another ledger record wrote)
    state: str
    file: str | None
    note: str = ""


class LogReport(NamedTuple):
    """`log`: the history of the target's record (`ledger` is the record's folder)."""

    target: Target
    ledger: Path
    store: Path  # the ledger directory holding it
    entries: list[Entry]


class StatusReport(NamedTuple):
    target: Target
    ledger: Path
    patches: tuple[PatchStatus, ...]
    interrupted: str | None = None  # an apply or revert killed half-way, finished by the next run


class CheckReport(NamedTuple):
    """`status --check`: is every patch meant for the target's release in place?"""

    target: Target
    ledger: Path
    in_place: tuple[str, ...]  # present: applied by sglpatch, by hand, or upstream
    missing: tuple[PatchStatus, ...]  # meant for this release and not there (note: why)
    skipped: tuple[str, ...]  # left out by the user's choice; never a failure
    not_needed: tuple[str, ...]  # not for this release
    upstream: tuple[str, ...] = ()  # those of `in_place` the release has upstream
    upgraded_from: str | None = None  # the release the ledger's patches were applied to, if other

    @property
    def ok(self) -> bool:
        return not self.missing

    @property
    def applied(self) -> tuple[str, ...]:
        """In place and not upstream: applied by sglpatch or by hand (`patch -p1`)."""
        return tuple(i for i in self.in_place if i not in self.upstream)


class CatalogueRow(NamedTuple):
    id: str
    description: str
    tested: str
    fixed_upstream_in: str | None
    origin: str
    file: str | None  # for `release`, if given
    outlook: str | None  # what apply would do on `release`, if given
    # with `release`: applies, already upstream, not for this release or refused
    effect: str | None = None


class DoctorReport(NamedTuple):
    """`doctor`'s answer on a target. `diagnosis` is the whole of it; the last three fields
    repeat its own (`kernels`, `kernels_from`, `model_from`) for scripts written before."""

    target: Target
    diagnosis: Diagnosis  # its blockers include the kernel packages' (source: the kernels)
    # The compiled packages beside SGLang (None: not judged, the target is a checkout).
    kernels: tuple[KernelFinding, ...] | None = None
    kernels_from: Path | None = None  # the site-packages they were read in
    # The config.json the model's architecture was read in: --model-path's, or a Hugging Face
    # id's snapshot in the local hub cache (None: --model named the architecture or module).
    model_from: Path | None = None


class ExportReport(NamedTuple):
    target: Target
    diff: str
    changed: tuple[str, ...]
    outcomes: tuple[Outcome, ...]
    output: str  # a path, or "-" for standard output

    @property
    def failures(self) -> list[Failed]:
        return [o for o in self.outcomes if isinstance(o, Failed)]


class Preview(NamedTuple):
    """One patch on its own: what it would do, for `apply --interactive`."""

    id: str
    description: str
    outcome: Outcome
    diff: str
    applied_with: tuple[str, ...] = ()  # the other halves of its change: one answer for all
