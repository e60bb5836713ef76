"""`revert`: every file sglpatch changed gets its recorded original bytes back."""

from __future__ import annotations

from pathlib import Path

from sglpatch.api.common import elsewhere_note, record_of
from sglpatch.errors import RefusedError
from sglpatch.reports import RevertReport
from sglpatch.store import Record, State, finish_interrupted, plan_revert, record_revert
from sglpatch.target import Target, find_target


def revert(
    target_path: Path | None, ledger_dir: Path | None = None, *, force: bool = False
) -> RevertReport:
    """Put back the recorded original bytes of every file sglpatch changed.

    A file whose bytes are neither what sglpatch wrote nor the original was edited (or replaced
    by an upgrade) since: refuse and name it, unless `force`, which first keeps those bytes in
    the ledger.
    """
    target = find_target(target_path, None, required=False)
    record = record_of(target, ledger_dir)
    record.require_git()
    with record.locked():
        done = finish_interrupted(record, or_undo=True)
        state = record.state()
        if not state.files:
            _refuse_foreign(record)
            return RevertReport(target, record.directory, (), (), (), None, done)
        plan = plan_revert(record, state, force)
        if (plan.edited or plan.replaced) and not force:
            raise _refusal(target, state, sorted(plan.edited), plan.replaced)
        commit = record_revert(record, plan)
        still = plan.still_applied
        return RevertReport(
            target,
            record.directory,
            plan.restored,
            tuple(plan.untouched),
            tuple(sorted(plan.edited)),
            commit,
            done,
            tuple(plan.replaced),
            tuple(p for p in state.patches if p not in still),
        )


def _refuse_foreign(record: Record) -> None:
    """Nothing recorded here: "nothing to revert" would be wrong if another record patched it."""
    foreign = record.ledger.foreign(record)
    if foreign:
        folder, owner = next(iter(foreign.values()))
        raise RefusedError(
            f"{', '.join(sorted(foreign))} hold bytes sglpatch wrote, "
            f"{elsewhere_note(folder, owner)}"
            f"; this ledger has no record of them. Run revert with --ledger "
            f"{folder.parent.parent} --target {owner}, or move the tree back"
        )


class UpgradedSince(RefusedError):
    """The target is another release than the one the ledger's patches were applied to.

    The safe step is an apply for the new release (the old record stays in the ledger's
    history); `advice` names it, with the commands spelled as the user typed them.
    """

    def __init__(self, recorded: str, now: str, files: list[str]) -> None:
        self.recorded, self.now, self.files = recorded, now, files
        super().__init__(self.advice("sglpatch apply", "sglpatch revert --force"))

    def advice(self, apply: str, force: str) -> str:
        return (
            f"the target is now SGLang {self.now} but the ledger's patches were applied to "
            f"{self.recorded}; reverting would write {self.recorded} files over it "
            f"({', '.join(self.files)}). Nothing changed. To patch {self.now}, run {apply} (the "
            f"{self.recorded} record stays in the ledger's history); {force} writes the "
            f"{self.recorded} files over {self.now} anyway"
        )


def _refusal(target: Target, state: State, edited: list[str], replaced: list[str]) -> RefusedError:
    if replaced:
        gone = ", ".join(replaced)
        also = f"; {', '.join(edited)} changed since sglpatch patched it" if edited else ""
        return RefusedError(
            f"{gone} is no longer a regular file{also}; nothing was reverted. revert --force "
            "restores the rest and leaves it (its original bytes stay in the ledger)"
        )
    if target.release is not None and state.release not in (None, str(target.release)):
        return UpgradedSince(str(state.release), str(target.release), edited)
    return RefusedError(
        f"{', '.join(edited)} changed since sglpatch patched it; nothing was reverted. "
        "revert --force keeps the edited bytes in the ledger, then restores the original"
    )
