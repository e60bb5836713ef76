"""One row per model, checkpoint and part: does it run on 12.0 / 12.1 now, and after apply?

A row is judged along the model's path, each step by what knows it:

1. start-up: the release's own ServerArgs resolution, run on a stand-in GPU of that part
   (`resolve`), gives the attention, DSA, MoE and GEMM backends, or the release's own refusal;
   each backend is judged with the kernel-support table on that part, its `needs` for that part
   included (`auto`, which the layer that loads the weights resolves, is judged in step 2 only);
2. load and run time: the catalogue patches still pending that this model's start-up reaches
   with the launch's flags and this checkpoint's quantization (their `concerns`), as doctor
   counts its blockers: each is a known failure that `sglpatch apply` fixes; and the steps
   nothing judges yet (`facts/unjudged_steps.py`);
3. what no patch fixes: the known gaps that always hold for the architecture, and what is
   unsettled for its checkpoint on that part.

`now` is the worst of what was found (breaks, then not evaluated, then needs, then runs);
`after_apply` is
the same once the pending patches are in: a start-up choice counts as fixed by a patch only
when the resolution, run again on the patched source, gives a backend the table does not rule
out on that part. A step that could not be evaluated makes the row "not evaluated", never
"runs".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from packaging.version import Version

from sglpatch.doctor import census, coverage, known_gaps, pending
from sglpatch.doctor.facts import kernel_support, unjudged_steps
from sglpatch.doctor.facts.model_configs import EVERY_MODEL, family
from sglpatch.doctor.models.shape import holds, shape_of
from sglpatch.doctor.read.source_tree import Source
from sglpatch.doctor.report import ModelRow
from sglpatch.doctor.resolve import Outcome, run_whole
from sglpatch.doctor.resolve.survey import Key, Wanted, again_at
from sglpatch.doctor.resolve.survey import capability as parsed_capability
from sglpatch.doctor.resolve.variants import Variant
from sglpatch.patch import MOE_LAYERS, Effect
from sglpatch.results import Failed

RUNS, BREAKS, NOT_EVALUATED, NEEDS = "runs", "breaks", "not evaluated", "needs"
_WORST = (BREAKS, NOT_EVALUATED, NEEDS, RUNS)  # a row's status: the first of these found
# Values that are not a kernel: "auto" is resolved later, by the layer that loads the weights;
# "nsa"/"dsa" dispatch to the DSA prefill/decode backends, which are judged themselves.
NOT_KERNELS = frozenset({"auto", "nsa", "dsa"})


class Later(Protocol):
    """Work handed over: its answer when asked."""

    def result(self) -> dict[str, list[Outcome]]: ...


class _Problem(NamedTuple):
    status: str  # BREAKS or NOT_EVALUATED
    why: str
    file: str | None = None
    line: int | None = None
    fixed_by: str | None = None  # the patch whose application removes it


class Inputs(NamedTuple):
    """What the rows are built from, read by diagnosis."""

    release: Version
    # Runs `survey.again_at(package_dir, ...)`, in a worker where there is one: an object whose
    # result() is the outcomes, by part.
    again: Callable[[Mapping[str, bytes], Mapping[str, Wanted]], Later]
    forms: Mapping[str, Sequence[Variant]]
    outcomes: Mapping[Key, Outcome]
    scopes: Mapping[str, pending.Scope]  # per architecture, quantization left unset
    work: Sequence[coverage.PatchCheck]
    eagle3_fixes: frozenset[str]  # patches that add EAGLE-3 methods: not on a default path


class Read(NamedTuple):
    """What doctor read that the rows need."""

    source: Source
    release: Version
    models: census.Models
    served: Sequence[census.Registered]  # the classes judged (drafts left out)
    # `survey.survey`'s answer, waited for when the rows are built.
    surveyed: Callable[[], tuple[dict[str, list[Variant]], dict[Key, Outcome]]]
    flags: Mapping[str, object] = {}  # the launch's options, by ServerArgs field


def scopes(read: Read) -> dict[str, pending.Scope]:
    """Each class of `read.served` scoped as doctor scopes `--model` (its modules read: done
    while the workers still run the survey)."""
    return {
        r.name: pending.Scope(
            {r.name}, pending.modules_of(read.models, [r]), {read.source.shown(r.path)}, None
        )
        for r in read.served
    }


def build(
    read: Read,
    scoped: Mapping[str, pending.Scope],
    work: Sequence[coverage.PatchCheck],
    eagle3_fixes: frozenset[str],
    capabilities: Sequence[str],
    submit: Callable[..., Later],
) -> Started:
    """The rows of every class in `read.served` (`scoped` by `scopes`), under way:
    `submit(fn, *args)` runs the resolution again for the start-up patches (a pool's `run`),
    and the answer's `result()` waits for those and gives the rows."""
    forms, outcomes = read.surveyed()
    scopes = {name: scope for name, scope in scoped.items() if name in forms}
    package_dir = read.source.package_dir

    def again(replaced: Mapping[str, bytes], asked: Mapping[str, Wanted]) -> Later:
        return submit(again_at, package_dir, replaced, asked, read.flags)

    inputs = Inputs(read.release, again, forms, outcomes, scopes, work, eagle3_fixes)
    return start(inputs, capabilities)


_Batch = tuple[coverage.PatchCheck, dict[str, list[Key]], Later]


class Started(NamedTuple):
    """Rows whose start-up patches are being run again (in the workers)."""

    inputs: Inputs
    capabilities: Sequence[str]
    labels: dict[tuple[str, str], Variant]
    reached: dict[tuple[str, str], list[coverage.PatchCheck]]
    now: dict[Key, list[_Problem]]
    batches: list[_Batch]

    def result(self) -> tuple[ModelRow, ...]:
        return _finish(self)


def start(inputs: Inputs, capabilities: Sequence[str]) -> Started:
    release = str(inputs.release)
    labels = {(arch, v.label): v for arch, forms in inputs.forms.items() for v in forms}
    blocking = _blocking(inputs)
    reached = {pair: _reached(inputs, blocking, *pair) for pair in labels}
    now = {
        key: _judge(outcome, key[2], release, labels[key[:2]])
        + _unrecorded(outcome, key[0], labels[key[:2]])
        for key, outcome in inputs.outcomes.items()
    }
    # Each start-up patch is run alone: a problem is fixed when one of them takes it away,
    # and what one of them brings (a choice that fails too) is added.
    batches: list[_Batch] = []  # all handed over at once: the workers run them side by side
    for check in _startup_patches(inputs.work):
        keys = {
            shown: [
                k
                for k, found in now.items()
                if k[2] == shown and (check in reached[k[0], k[1]] or _breaks(found))
            ]
            for shown in capabilities
        }
        asked = {
            part: [(k[0], labels[k[0], k[1]]) for k in found]
            for part, found in keys.items()
            if found
        }
        if asked:
            replaced = {check.file: check.after} if check.after is not None else {}
            batches.append((check, keys, inputs.again(replaced, asked)))
    return Started(inputs, capabilities, labels, reached, now, batches)


def _finish(started: Started) -> tuple[ModelRow, ...]:
    inputs, capabilities, labels, reached, now, batches = started
    release = str(inputs.release)
    fixed: dict[Key, set[str]] = {key: set() for key in now}
    brought: dict[Key, list[_Problem]] = {key: [] for key in now}
    later: dict[Key, list[_Problem]] = {key: [] for key in now}
    changed: dict[Key, list[str]] = {key: [] for key in now}
    # The backends each start-up gives, as it is and with each start-up patch in.
    chosen = {key: _backends(outcome) for key, outcome in inputs.outcomes.items()}
    for check, keys, task in batches:
        answers = task.result()
        for key, outcome in (
            pair for shown in answers for pair in zip(keys[shown], answers[shown], strict=True)
        ):
            shown = key[2]
            chosen[key] |= _backends(outcome)
            before = inputs.outcomes[key]
            if outcome.not_evaluated or (outcome.choices, outcome.refused) == (
                before.choices,
                before.refused,
            ):
                continue  # this model's start-up is not where the patch changes anything
            if outcome.refused == before.refused and before.refused_on_reference:
                outcome = dataclasses.replace(outcome, refused_on_reference=True)
            # Judged as `now` is: a field the family's record lacks is as unknown after apply.
            patched = _judge(outcome, shown, release, labels[key[0], key[1]]) + _unrecorded(
                outcome, key[0], labels[key[0], key[1]]
            )
            still = {p.why for p in patched}
            fixed[key] |= {p.why for p in now[key] if p.why not in still}
            was = {p.why for p in now[key]}
            brought[key] += [p for p in patched if p.why not in was]
            changed[key].append(check.patch.id)
            if check in reached[key[0], key[1]] and not _breaks(now[key]):
                later[key].append(_Problem(BREAKS, check.patch.symptom, check.file))
    after = {
        key: [p for p in found if p.why not in fixed[key]] + brought[key]
        for key, found in now.items()
    }
    found: list[ModelRow] = []
    for (arch, label), variant in sorted(labels.items()):
        unjudged = _unjudged(inputs, arch, variant)
        for shown in capabilities:
            key = (arch, label, shown)
            rest = _later_problems(reached[arch, label], variant, chosen[key]) + unjudged
            gaps = _gaps(inputs, arch, variant, shown)
            found.append(
                _row(
                    arch,
                    variant,
                    shown,
                    [*now[key], *later[key], *rest, *gaps],
                    [*after[key], *[p for p in rest if p.fixed_by is None], *gaps],
                    (*changed[key], *(p.fixed_by for p in rest if p.fixed_by)),
                )
            )
    return tuple(found)


def _row(
    arch: str,
    variant: Variant,
    shown: str,
    now: list[_Problem],
    after: list[_Problem],
    patches: Iterable[str | None],
) -> ModelRow:
    status, left = _worst(p.status for p in now), _worst(p.status for p in after)
    # Why: what is left after apply, else what apply fixes.
    first = next((p for p in after if p.status == left), None) if left != RUNS else None
    first = first or next((p for p in now if p.status == status), None)
    return ModelRow(
        arch,
        variant.quantization,
        variant.form,
        shown,
        status,
        left,
        tuple(dict.fromkeys(p for p in patches if p)),
        first.why if first else "",
        first.file if first else None,
        first.line if first else None,
    )


def _worst(statuses: Iterable[str]) -> str:
    seen = set(statuses)
    return next((s for s in _WORST if s in seen), RUNS)


def _breaks(problems: Sequence[_Problem]) -> bool:
    return any(p.status == BREAKS for p in problems)


def _startup_patches(work: Sequence[coverage.PatchCheck]) -> list[coverage.PatchCheck]:
    """Pending patches on a module the resolution runs whole, which apply."""
    return [c for c in work if c.after is not None and not _fails(c) and _startup(c)]


def _startup(check: coverage.PatchCheck) -> bool:
    return run_whole(check.file[: -len(".py")].replace("/", "."))


def _reached(
    inputs: Inputs, work: Sequence[coverage.PatchCheck], arch: str, label: str
) -> list[coverage.PatchCheck]:
    """The patches of `work` (`_blocking`'s) this checkpoint's start-up reaches with default
    flags, by their `concerns` (doctor's blockers for it)."""
    scope = inputs.scopes.get(arch)
    if scope is None:
        return []
    variant = next(v for v in inputs.forms[arch] if v.label == label)
    asked = scope._replace(
        quantization=variant.quantization or "unquantized",
        config=frozenset(("architectures", *(name for name, _ in variant.extra))),
    )
    ids = {b.source for b in pending.sort(work, None, asked, None).blockers}
    return [c for c in work if c.patch.id in ids]


def _blocking(inputs: Inputs) -> list[coverage.PatchCheck]:
    """The pending patches that may block a model: not EAGLE-3's methods, not a table's
    completion (sorted once here, not again for every checkpoint)."""
    return [
        c
        for c in inputs.work
        if c.patch.id not in inputs.eagle3_fixes
        and c.patch.effect_on(inputs.release) is not Effect.TABLE
    ]


def on_path(
    found: pending.Sorted,
    rows: Sequence[ModelRow],
    quantization: str | None,
    work: Sequence[coverage.PatchCheck],
) -> pending.Sorted:
    """`--model`'s blockers, less the patches its rows show off its path: a patch on a start-up
    file blocks only where running the resolution on its result changes this model's start-up,
    one reached through a backend only where the start-up gives it (as it is or once patched),
    for the checkpoint's quantization when it is known (issue #34, point 4)."""
    wanted = None if quantization in (None, "unquantized") else quantization
    relevant = [r for r in rows if quantization is None or r.quantization == wanted]
    if not relevant:  # a quantization the rows do not evaluate: nothing to go by
        return found
    # A start-up patch, or one reached through a backend only, where no row of it uses it.
    judged = {c.patch.id for c in work if _startup(c) or c.patch.concerns.backends}
    used = {p for r in relevant for p in r.patches}
    off = [b for b in found.blockers if b.source in judged and b.source not in used]
    if not off:
        return found
    return found._replace(
        blockers=[b for b in found.blockers if b not in off],
        elsewhere=[*found.elsewhere, *(b.source for b in off)],
    )


def _unrecorded(outcome: Outcome, arch: str, variant: Variant) -> list[_Problem]:
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
    return [_Problem(NOT_EVALUATED, why + " (facts/model_configs.json): the default was taken")]


def _backends(outcome: Outcome) -> set[tuple[str, str]]:
    return {(kind, value) for kind, _, value in outcome.choices}


def _later_problems(
    reached: Sequence[coverage.PatchCheck], variant: Variant, chosen: set[tuple[str, str]]
) -> list[_Problem]:
    """Step 2: the pending patches off start-up this checkpoint reaches (None: apply cannot
    fix it, the patch fails on this tree); not one whose failure needs a shape the family's
    recorded config does not have, or a backend its start-up never gives (`chosen`)."""
    shape = shape_of(dict(variant.extra))
    found = []
    for c in reached:
        concerns = c.patch.concerns
        if _startup(c) or (concerns.backends and not chosen & set(concerns.backends)):
            continue
        judged = holds(concerns, shape)
        if judged is False:
            continue
        unread = bool(concerns.condition) and judged is None
        found.append(
            _Problem(
                NOT_EVALUATED if unread else BREAKS,
                f"{c.patch.symptom} ({concerns.condition}, which is not read)"
                if unread
                else c.patch.symptom,
                c.file,
                None,
                None if _fails(c) else c.patch.id,
            )
        )
    return found


def _unjudged(inputs: Inputs, arch: str, variant: Variant) -> list[_Problem]:
    """Steps of this checkpoint's path that nothing judges yet (`facts/unjudged_steps.py`)."""
    moe = _has_moe(inputs, arch)
    return [
        _Problem(NOT_EVALUATED, why)
        for why in unjudged_steps.steps(inputs.release, variant.quantization, variant.form, moe)
    ]


def _has_moe(inputs: Inputs, arch: str) -> bool:
    """The class reaches MoE layers through its models module or the one it builds on."""
    scope = inputs.scopes.get(arch)
    return scope is not None and any(m.startswith(MOE_LAYERS) for m in scope.modules)


def _fails(check: coverage.PatchCheck) -> bool:
    return isinstance(check.outcome, Failed)


def _gaps(inputs: Inputs, arch: str, variant: Variant, shown: str) -> list[_Problem]:
    """Step 3: the known gaps that always hold for the architecture on this part, and what
    is unsettled for its checkpoint there (not evaluated: reports disagree)."""
    known = known_gaps.known(inputs.release, {arch}, (shown,))
    scope = inputs.scopes.get(arch)
    moe = scope is not None and any(m.startswith(MOE_LAYERS) for m in scope.modules)
    return [_Problem(BREAKS, f"{gap.what} (no patch: {gap.fix})") for gap in known.blockers] + [
        _Problem(NOT_EVALUATED, gap.what)
        for gap in known.notes
        if gap.quantization and gap.quantization == variant.quantization and moe
    ]


def _judge(outcome: Outcome, shown: str, release: str, variant: Variant) -> list[_Problem]:
    """The start-up's refusal and each backend it gives, by the kernel table on part `shown`;
    the DSA backends only for the DSA form (0.5.3 - 0.5.8 default them for every model)."""
    if outcome.not_evaluated is not None:
        return [_Problem(NOT_EVALUATED, f"start-up not evaluated: {outcome.not_evaluated}")]
    capability = parsed_capability(shown)
    found = []
    if outcome.refused is not None and outcome.refused_on_reference:
        file, line = outcome.refused_at or (None, None)
        why = f"start-up refuses every GPU (10.0 too) without a flag: {outcome.refused}"
        found.append(_Problem(NOT_EVALUATED, why + "; a launch with it is not judged", file, line))
    elif outcome.refused is not None:
        file, line = outcome.refused_at or (None, None)
        found.append(_Problem(BREAKS, f"start-up refuses: {outcome.refused}", file, line))
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
            found.append(_Problem(BREAKS, why, file, line))
        elif answer is None:
            why = f"{field} = {value!r}: the kernel table does not know {kind}/{name} on {shown}"
            found.append(_Problem(NOT_EVALUATED, why, file, line))
        elif record is not None:  # it runs there, given what the table says it needs
            for need in record.needs_on(capability):
                why = f"{field} = {value!r}: {kind}/{name} on {shown} needs {need}"
                found.append(_Problem(NEEDS, why, file, line))
    return found
