"""What one checkpoint's path holds on one part, step by step (`model_rows` makes the rows):
its start-up's refusal and backends judged by the kernel-support table, the fields its family's
record lacks, and the pending patches off start-up that it reaches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sglpatch.doctor import coverage
from sglpatch.doctor.facts import kernel_support
from sglpatch.doctor.facts.model_configs import EVERY_MODEL, family
from sglpatch.doctor.models.shape import holds, shape_of
from sglpatch.doctor.report import BREAKS, NEEDS, NOT_EVALUATED
from sglpatch.doctor.resolve import Outcome, run_whole
from sglpatch.doctor.resolve.survey import capability as parsed_capability
from sglpatch.doctor.resolve.variants import Variant
from sglpatch.patch import Concerns
from sglpatch.results import Failed

# Values that are not a kernel: "auto" is resolved later, by the layer that loads the weights;
# "nsa"/"dsa" dispatch to the DSA prefill/decode backends, which are judged themselves.
NOT_KERNELS = frozenset({"auto", "nsa", "dsa"})


class Problem(NamedTuple):
    status: str  # BREAKS or NOT_EVALUATED
    why: str
    file: str | None = None
    line: int | None = None
    fixed_by: str | None = None  # the patch whose application removes it


def startup(check: coverage.PatchCheck) -> bool:
    return run_whole(check.file[: -len(".py")].replace("/", "."))


def fails(check: coverage.PatchCheck) -> bool:
    return isinstance(check.outcome, Failed)


def unrecorded(outcome: Outcome, arch: str, variant: Variant) -> list[Problem]:
    """The release read a field of this model's config.json that the stand-in did not carry,
    and that no published config of its family recorded: the code's default was taken, which
    the real checkpoint may not leave it (the row is not evaluated)."""
    recorded = family(arch, dsa=variant.form == "dsa")
    known = set(recorded.config) if recorded else set()
    if variant.form is None:
        known.add("index_topk")  # its absence is what makes this the form without DSA
    names = [
        name
        for name in (a.split(".", 1)[1] for a in outcome.absent if a.startswith("hf_config."))
        if name not in EVERY_MODEL and name not in known
    ]
    if not names or outcome.not_evaluated:
        return []
    shown = ", ".join(names)
    why = f"start-up read {shown} of the model's config, which is not recorded for its family"
    return [Problem(NOT_EVALUATED, why + " (facts/model_configs.json): the default was taken")]


def in_reach(concerns: Concerns, outcome: Outcome) -> bool:
    """The start-up `outcome` gives a backend the patch's code runs under (`backends`), and
    not the setting that keeps it away (`unless`)."""
    chosen = {(kind, value) for kind, _, value in outcome.choices}
    if concerns.backends and not chosen & set(concerns.backends):
        return False
    if concerns.unless is not None:
        option, _, value = concerns.unless.partition(" ")
        field = option.lstrip("-").replace("-", "_")
        return (field, value) not in outcome.settings
    return True


def later_problems(
    reached: Sequence[coverage.PatchCheck], variant: Variant, states: Sequence[Outcome]
) -> list[Problem]:
    """Step 2: the pending patches off start-up this checkpoint reaches (None: apply cannot
    fix it, the patch fails on this tree); not one whose failure needs a shape the family's
    recorded config does not have, or that no start-up of it reaches (`states`: as it is, and
    with each start-up patch in)."""
    shape = shape_of(dict(variant.extra))
    found = []
    for c in reached:
        concerns = c.patch.concerns
        if startup(c) or not any(in_reach(concerns, state) for state in states):
            continue
        judged = holds(concerns, shape)
        if judged is False:
            continue
        unread = bool(concerns.condition) and judged is None
        found.append(
            Problem(
                NOT_EVALUATED if unread else BREAKS,
                f"{c.patch.symptom} ({concerns.condition}, which is not read)"
                if unread
                else c.patch.symptom,
                c.file,
                None,
                None if fails(c) else c.patch.id,
            )
        )
    return found


def judge(outcome: Outcome, shown: str, release: str, variant: Variant) -> list[Problem]:
    """The start-up's refusal and each backend it gives, by the kernel table on part `shown`;
    the DSA backends only for the DSA form (0.5.3 - 0.5.8 default them for every model)."""
    if outcome.not_evaluated is not None:
        return [Problem(NOT_EVALUATED, f"start-up not evaluated: {outcome.not_evaluated}")]
    capability = parsed_capability(shown)
    found = []
    if outcome.refused is not None and outcome.refused_on_reference:
        file, line = outcome.refused_at or (None, None)
        why = f"start-up refuses every GPU (10.0 too) without a flag: {outcome.refused}"
        found.append(Problem(NOT_EVALUATED, why + "; a launch with it is not judged", file, line))
    elif outcome.refused is not None:
        file, line = outcome.refused_at or (None, None)
        found.append(Problem(BREAKS, f"start-up refuses: {outcome.refused}", file, line))
    where = dict((field, (file, line)) for field, file, line in outcome.where)
    for kind, field, value in outcome.choices:
        if value in NOT_KERNELS or (kind == "dsa" and variant.form != "dsa"):
            continue
        name = kernel_support.gemm_name(field.split("_")[0], value) if kind == "gemm" else value
        record = kernel_support.lookup(kind, name, release)
        answer = None if record is None else record.judge(capability)
        file, line = where.get(field, (None, None))
        if answer is False and record is not None:
            why = f"{field} = {value!r}: {kind}/{name} runs on {record.shown_range()}"
            found.append(Problem(BREAKS, why, file, line))
        elif answer is None:
            why = f"{field} = {value!r}: the kernel table does not know {kind}/{name} on {shown}"
            found.append(Problem(NOT_EVALUATED, why, file, line))
        elif record is not None:  # it runs there, given what the table says it needs
            for need in record.needs_on(capability):
                why = f"{field} = {value!r}: {kind}/{name} on {shown} needs {need}"
                found.append(Problem(NEEDS, why, file, line))
    return found
