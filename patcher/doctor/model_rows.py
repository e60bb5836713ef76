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
from sglpatch.doctor import model_problems as problems
from sglpatch.doctor.facts import unjudged_steps
from sglpatch.doctor.model_problems import Problem
from sglpatch.doctor.read.source_tree import Source
from sglpatch.doctor.report import BREAKS, NEEDS, NOT_EVALUATED, RUNS, ModelRow
from sglpatch.doctor.resolve import Outcome
from sglpatch.doctor.resolve.survey import Key, Wanted, again_at
from sglpatch.doctor.resolve.variants import Variant
from sglpatch.patch import MOE_LAYERS, Effect

_WORST = (BREAKS, NOT_EVALUATED, NEEDS, RUNS)  # a row's status: the first of these found


class Later(Protocol):
    """Work handed over: its answer when asked."""

    def result(self) -> dict[str, list[Outcome]]: ...


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
    now: dict[Key, list[Problem]]
    batches: list[_Batch]

    def result(self) -> tuple[ModelRow, ...]:
        return _finish(self)


def start(inputs: Inputs, capabilities: Sequence[str]) -> Started:
    release = str(inputs.release)
    labels = {(arch, v.label): v for arch, forms in inputs.forms.items() for v in forms}
    blocking = _blocking(inputs)
    reached = {pair: _reached(inputs, blocking, *pair) for pair in labels}
    now = {
        key: problems.judge(outcome, key[2], release, labels[key[:2]])
        + problems.unrecorded(outcome, key[0], labels[key[:2]])
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
    brought: dict[Key, list[Problem]] = {key: [] for key in now}
    later: dict[Key, list[Problem]] = {key: [] for key in now}
    changed: dict[Key, list[str]] = {key: [] for key in now}
    # Each start-up, as it is and with each start-up patch in.
    states = {key: [outcome] for key, outcome in inputs.outcomes.items()}
    for check, keys, task in batches:
        answers = task.result()
        for key, outcome in (
            pair for shown in answers for pair in zip(keys[shown], answers[shown], strict=True)
        ):
            shown = key[2]
            states[key].append(outcome)
            before = inputs.outcomes[key]
            if outcome.not_evaluated or (outcome.choices, outcome.refused) == (
                before.choices,
                before.refused,
            ):
                continue  # this model's start-up is not where the patch changes anything
            if outcome.refused == before.refused and before.refused_on_reference:
                outcome = dataclasses.replace(outcome, refused_on_reference=True)
            # Judged as `now` is: a field the family's record lacks is as unknown after apply.
            patched = problems.judge(
                outcome, shown, release, labels[key[0], key[1]]
            ) + problems.unrecorded(outcome, key[0], labels[key[0], key[1]])
            still = {p.why for p in patched}
            fixed[key] |= {p.why for p in now[key] if p.why not in still}
            was = {p.why for p in now[key]}
            brought[key] += [p for p in patched if p.why not in was]
            changed[key].append(check.patch.id)
            if check in reached[key[0], key[1]] and not _breaks(now[key]):
                later[key].append(Problem(BREAKS, check.patch.symptom, check.file))
    after = {
        key: [p for p in found if p.why not in fixed[key]] + brought[key]
        for key, found in now.items()
    }
    found: list[ModelRow] = []
    for (arch, label), variant in sorted(labels.items()):
        unjudged = _unjudged(inputs, arch, variant)
        for shown in capabilities:
            key = (arch, label, shown)
            rest = problems.later_problems(reached[arch, label], variant, states[key]) + unjudged
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
    now: list[Problem],
    after: list[Problem],
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


def _breaks(problems: Sequence[Problem]) -> bool:
    return any(p.status == BREAKS for p in problems)


def _startup_patches(work: Sequence[coverage.PatchCheck]) -> list[coverage.PatchCheck]:
    """Pending patches on a module the resolution runs whole, which apply."""
    return [
        c for c in work if c.after is not None and not problems.fails(c) and problems.startup(c)
    ]


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
    judged = {
        c.patch.id
        for c in work
        if problems.startup(c) or c.patch.concerns.backends or c.patch.concerns.unless
    }
    used = {p for r in relevant for p in r.patches}
    off = [b for b in found.blockers if b.source in judged and b.source not in used]
    if not off:
        return found
    return found._replace(
        blockers=[b for b in found.blockers if b not in off],
        elsewhere=[*found.elsewhere, *(b.source for b in off)],
    )


def _unjudged(inputs: Inputs, arch: str, variant: Variant) -> list[Problem]:
    """Steps of this checkpoint's path that nothing judges yet (`facts/unjudged_steps.py`)."""
    moe = _has_moe(inputs, arch)
    return [
        Problem(NOT_EVALUATED, why)
        for why in unjudged_steps.steps(inputs.release, variant.quantization, variant.form, moe)
    ]


def _has_moe(inputs: Inputs, arch: str) -> bool:
    """The class reaches MoE layers through its models module or the one it builds on."""
    scope = inputs.scopes.get(arch)
    return scope is not None and any(m.startswith(MOE_LAYERS) for m in scope.modules)


def _gaps(inputs: Inputs, arch: str, variant: Variant, shown: str) -> list[Problem]:
    """Step 3: the known gaps that always hold for the architecture on this part, and what
    is unsettled for its checkpoint there (not evaluated: reports disagree)."""
    known = known_gaps.known(inputs.release, {arch}, (shown,))
    scope = inputs.scopes.get(arch)
    moe = scope is not None and any(m.startswith(MOE_LAYERS) for m in scope.modules)
    return [Problem(BREAKS, f"{gap.what} (no patch: {gap.fix})") for gap in known.blockers] + [
        Problem(NOT_EVALUATED, gap.what)
        for gap in known.notes
        if gap.quantization and variant.quantization in gap.quantization and moe
    ]
