"""The catalogue patches that still have work on the target, sorted for the report: blockers,
opt-in (a flag leads there), tables only, other models' (or quantizations'), and undecided (the
model's module could not be read). `diagnosis`'s docstring says what decides each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from packaging.version import Version

from sglpatch.doctor import census, coverage
from sglpatch.doctor.models.shape import Shape, holds
from sglpatch.doctor.report import UNTESTED, Blocker, ModelReport
from sglpatch.patch import Effect
from sglpatch.results import Failed


class Scope(NamedTuple):
    """The model `--model` chose, as patches' `concerns` are matched against it."""

    names: set[str]  # its registered classes
    modules: set[str]  # sglang.srt.models.x defining them, and the modules those import from
    files: set[str]  # sglang/srt/models/x.py read for it
    quantization: str | None  # the checkpoint's, when known
    unread: tuple[str, ...] = ()  # what doctor could not read of it (sglang/...): not judged
    config: frozenset[str] | None = None  # the config.json attributes it sets; None: unknown
    shape: Shape = Shape()  # the head sizes its config gives


class Sorted(NamedTuple):
    blockers: list[Blocker]
    opt_in: list[Blocker]
    tables: list[Blocker]
    elsewhere: list[str]
    undecided: list[str]


def modules_of(models: census.Models, registered: Sequence[census.Registered]) -> set[str]:
    """The modules defining the classes, those they import, and those the models modules among
    these import (Kimi K2.5's MoE layers come with `deepseek_v2`, which it imports)."""
    found: set[str] = set()
    for entry in registered:
        for path in (entry.path, entry.listed_in):
            summary = models.summary(path)
            if summary is not None:
                found.add(summary.module)
                found.update(module for module, _ in summary.imports.values())
    for module in [m for m in found if m.startswith(_MODELS)]:
        target = models.source.module_file(module)
        summary = models.summary(target) if target is not None else None
        if summary is not None:
            found.update(imported for imported, _ in summary.imports.values())
    return found


_MODELS = "sglang.srt.models."


def _concerned(check: coverage.PatchCheck, asked: Scope) -> bool:
    """Whether the model's start-up reaches the patch's code (quantization and flag aside)."""
    concerns = check.patch.concerns
    if concerns.runtime != "srt":
        return False
    if concerns.every_model:
        # A patch that names no model but edits a models module concerns that module's models.
        return not check.file.startswith("sglang/srt/models/") or check.file in asked.files
    return bool(concerns.architectures and asked.names & set(concerns.architectures)) or any(
        module == used or module.startswith(f"{used}.")
        for used in concerns.uses
        for module in asked.modules
    )


def sort(
    work: Sequence[coverage.PatchCheck],
    chosen: ModelReport | None,
    asked: Scope | None,
    release: Version | None,
    passed: frozenset[str] | None = None,
) -> Sorted:
    """The pending patches, in one list each: blockers, opt-in, tables, other models', undecided.

    `passed`: the `Concerns.flag`s (and `unless`es) the user's launch passes (None: no launch
    given). A patch behind a flag blocks when the launch passes it; with a launch that does not,
    it is opt-in. One whose `unless` the launch passes is not on this launch's path.
    """
    found = Sorted([], [], [], [], [])
    for check in work:
        patch = check.patch
        if chosen is not None and chosen.fixed_by == patch.id:
            continue  # reported as the model's missing methods
        concerns = patch.concerns
        when = f"with {concerns.flag}" if concerns.flag else ""
        if release is not None and patch.effect_on(release) is Effect.TABLE:
            found.tables.append(_as_pending(check, release, f"{Effect.TABLE.value} on {release}"))
            continue
        launched = passed is None or concerns.flag is None or concerns.flag in passed
        if asked is None:
            if check.file.startswith("sglang/srt/models/"):
                continue  # another model's fix
            rows = found.blockers if launched else found.opt_in
            rows.append(_as_pending(check, release, when=when))
            continue
        wanted = concerns.quantization
        if wanted and asked.quantization is not None and asked.quantization not in wanted:
            found.elsewhere.append(patch.id)
        elif (
            not _concerned(check, asked)
            or _other_form(concerns.config, asked.config)
            or holds(concerns, asked.shape) is False
            or (concerns.unless is not None and passed is not None and concerns.unless in passed)
        ):
            unknown = asked.unread and concerns.runtime == "srt"  # it may concern the model
            (found.undecided if unknown else found.elsewhere).append(patch.id)
        elif concerns.flag and (passed is None or concerns.flag not in passed):
            found.opt_in.append(_as_pending(check, release, when=when))
        else:  # reached: by default, or by a flag the launch passes (said as its condition)
            condition = "" if not wanted or asked.quantization else _if_quantized(wanted)
            unread = "" if holds(concerns, asked.shape) else concerns.condition
            condition = "; ".join(filter(None, (when, condition, unread)))
            found.blockers.append(_as_pending(check, release, when=condition))
    return found


def _other_form(wanted: tuple[str, ...], config: frozenset[str] | None) -> bool:
    """The patch is about a form of the model (DSA: `index_topk`) this config is not."""
    return bool(wanted) and config is not None and not set(wanted) <= config


def _if_quantized(quantization: tuple[str, ...]) -> str:
    return f"if the checkpoint is {' or '.join(quantization)}"


def _as_pending(
    check: coverage.PatchCheck, release: Version | None, note: str = "", when: str = ""
) -> Blocker:
    """A pending patch as a row of the report: fixed by apply, or the reason it fails."""
    patch = check.patch
    if isinstance(check.outcome, Failed):
        fails = f"the patch fails: {check.outcome.reason}"
        return Blocker(patch.symptom, patch.id, None, "; ".join(filter(None, (fails, note))), when)
    if release is not None and not patch.is_tested(release):
        note = "; ".join(filter(None, (note, UNTESTED)))
    return Blocker(patch.symptom, patch.id, patch.id, note, when)
