"""doctor's answer: will this SGLang run on capability-12 GPUs, with EAGLE-3 on this model?

Blockers are what is known to break: the catalogue patches that still have work on this release
(each declares the `symptom` a capability-12 user sees without it) and, when EAGLE-3 is asked
for (`eagle3`: `--eagle3` or the launch's `--speculative-algorithm EAGLE3`), the chosen model's
missing EAGLE-3 methods (otherwise reported, not counted). A pending patch whose effect on this
release only completes a table (`Effect.TABLE`) is listed as such, never a blocker. Without a
model, every other pending patch blocks (the whole release), but one that edits a models module.
With one, what each patch `concerns` decides: a blocker is a patch this model's start-up reaches
with default flags; one that needs an opt-in flag is listed apart (a blocker when the launch
given passes that flag; with a launch that does not, listed apart without a model too), one
about other models (or, when the quantization is known, other quantizations) is counted; where
the model's module could not be read, which patches concern it is unknown: those are listed as
not judged for it, never as other models'.
A quantization-specific patch blocks when the quantization is not known, with its condition ("if
the checkpoint is fp8"): apply fixes it either way, and "ready" must hold for every checkpoint of
the model. The scanner's findings are suspects: judged against the kernel-support table for each
capability asked (`judged`); those that fail there (or lose a path that runs there) are listed,
those the table does not know are listed apart, the harmless counted; blockers only under
`strict`. A file doctor could not read or parse, or a folder it could not list, is not judged:
listed, and the answer cannot be "ready" (what it holds is unknown). Ready means no blockers and
every file judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from sglpatch.doctor import (
    census,
    coverage,
    judged,
    known_gaps,
    model_rows,
    pending,
    tree_reading,
    unreached,
)
from sglpatch.doctor.eagle3 import missing_methods
from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.doctor.findings import Finding, Kind
from sglpatch.doctor.gates import devices
from sglpatch.doctor.models.shape import Shape
from sglpatch.doctor.read import pool
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source, read_file
from sglpatch.doctor.report import (
    Blocker,
    Diagnosis,
    GpuChoice,
    Launched,
    ModelReport,
    Origin,
    Suspect,
    Unread,
)
from sglpatch.patch import Patch

if TYPE_CHECKING:
    from sglpatch.doctor.environment import Environment

Progress = tree_reading.Progress


def diagnose(
    package_dir: Path,
    release: Version | None,
    patches: Sequence[Patch],
    model: str | None = None,
    *,
    strict: bool = False,
    progress: Progress | None = None,
    quantization: str | None = None,
    capabilities: Sequence[str] = CAPABILITIES,
    beside: Callable[[], Environment | None] | None = None,
    model_from: Path | None = None,
    config_fields: frozenset[str] | None = None,
    shape: Shape | None = None,
    quantization_from: str = "",
    eagle3: bool = False,
    launch: Launched | None = None,
    gpu: GpuChoice | None = None,
    all_models: bool = False,
) -> Diagnosis:
    """The whole answer for the tree at `package_dir`. `beside` reads the environment that runs
    it (its kernels and missing requirements; None: not judged), once the tree is read;
    `model_from` is the config.json that named `model`, `config_fields` the fields it sets,
    `shape` the head sizes it gives."""
    say = progress or (lambda _: None)  # the stages, for a terminal's progress line
    source = Source(package_dir)
    paths, names = _models_asked(source, model)
    helpers = devices.helpers_of(source)
    with pool.Pool() as workers:  # on an error, the workers are stopped, their work dropped
        rows_for = capabilities if release is not None and (all_models or model) else ()
        flags = dict(launch.fields) if launch is not None else {}
        reading = tree_reading.read_tree(
            source, package_dir, release, patches, paths, names, helpers, say, workers, rows_for,
            flags,
        )  # fmt: skip
        rows_read = _rows_read(source, release, reading, flags)  # None: no rows asked for
        scoped = model_rows.scopes(rows_read) if rows_read else {}  # while the catalogue runs
        work = coverage.pending(reading.checks)  # the catalogue's worker started first
        reports = tuple(
            _model_report(source, reading.models, r, reading.required, work)
            for r in reading.registered
            if not r.excluded
        )
        started = (  # the start-up patches run again in the workers while they scan
            model_rows.build(
                rows_read,
                scoped,
                work,
                frozenset(r.fixed_by for r in reports if r.fixed_by),
                capabilities,
                workers.run,
            )
            if rows_read
            else None
        )
        read = reading.finish()
        if started is None:
            workers.finish()  # they end while what they found is judged here
        covered, gone = _covered(source, helpers, read, work)
        rows = None
        if started is not None:
            say("judging each model on 12.0 and 12.1")
            rows = started.result()
            workers.finish()
        every = [  # a patch in the tree keeps 12 out of the function holding it
            s._replace(outcome=judged.HARMLESS) if s.finding in gone else s
            for s in _judged(read.findings, covered, release, capabilities)
        ]
    chosen = reports[0] if model is not None and len(reports) == 1 else None
    suspects = tuple(s for s in every if s.outcome in judged.LISTED)
    asked = _asked(source, paths, read, quantization) if model is not None else None
    if asked is not None:
        asked = asked._replace(config=config_fields, shape=shape or Shape())
    found = pending.sort(work, chosen, asked, release, launch and launch.passed)
    if asked is not None and rows:  # a start-up patch is a blocker where it changes the start-up
        found = model_rows.on_path(found, rows, quantization, work)
    gaps, maybe, known = known_gaps.rows(
        release,
        asked and asked.names,
        capabilities,
        asked.quantization if asked is not None else None,
    )
    blockers = found.blockers + gaps
    if model is not None and eagle3:  # the model's EAGLE-3 methods, when EAGLE-3 is asked for
        blockers += missing_methods(reports)
    if strict:
        blockers += [_as_blocker(s) for s in suspects]
    environment = beside() if beside is not None else None
    if environment is not None:  # its missing requirements first, the kernels last
        blockers = [*environment.missing, *blockers, *environment.failing]
    return Diagnosis(
        release=release,
        model=chosen,
        blockers=tuple(blockers),
        suspects=suspects,
        refusals=tuple(f for f in read.findings if f.kind is Kind.REFUSAL),
        required=read.required,
        models=reports,
        excluded={r.name: r.excluded for r in read.registered if r.excluded},
        strict=strict,
        asked=model,
        not_judged=tuple(Unread(f, why) for f, why in sorted(source.not_judged.items())),
        opt_in=tuple(found.opt_in + maybe),
        tables=tuple(found.tables),
        elsewhere=tuple(found.elsewhere),
        quantization=quantization if model is not None else None,
        unjudged=tuple(s for s in every if s.outcome is judged.NOT_JUDGED),
        harmless=sum(1 for s in every if s.outcome is judged.HARMLESS),
        capabilities=tuple(capabilities),
        undecided=tuple(found.undecided),
        known=known,
        kernels=None if environment is None else environment.kernels,
        kernels_from=None if environment is None else environment.site,
        model_from=model_from,
        quantization_from=quantization_from if model is not None else "",
        eagle3=eagle3,
        draft=_draft(model, read.registered),
        launch=launch,
        gpu=gpu,
        rows=rows,
    )


def _draft(model: str | None, registered: Sequence[census.Registered]) -> str | None:
    """The draft model class (EAGLE, NextN, MTP) the model asked for is, if it is one."""
    if model is None:
        return None
    drafts = [r.name for r in registered if tree_reading.is_draft(r)]
    return drafts[0] if drafts and len(drafts) == len(registered) else None


def _rows_read(
    source: Source,
    release: Version | None,
    reading: tree_reading.Reading,
    flags: Mapping[str, object],
) -> model_rows.Read | None:
    """What the rows are built from, the survey's answer waited for only when they are."""
    task = reading.survey
    if task is None or release is None:
        return None
    served = [r for r in reading.registered if not tree_reading.is_draft(r)]
    return model_rows.Read(source, release, reading.models, served, task.result, flags)


def _covered(
    source: Source,
    helpers: devices.Helpers,
    read: tree_reading.Read,
    work: Sequence[coverage.PatchCheck],
) -> tuple[dict[Finding, str], set[Finding]]:
    """finding -> the pending patch that changes what 12 gets there; and the findings a patch in
    the tree keeps 12 away from (`unreached`)."""
    package_dir = source.package_dir

    def current(shown: str) -> bytes | None:
        return _current(package_dir, shown)

    rescan = _rescanner(source, helpers, package_dir)
    covered = coverage.covered_by(read.findings, work, rescan, current)
    for finding, patch_id in unreached.covered(read.findings, work, current).items():
        covered.setdefault(finding, patch_id)
    return covered, unreached.settled(read.findings, read.checks, current)


def _judged(
    findings: Sequence[Finding],
    covered: dict[Finding, str],
    release: Version | None,
    capabilities: Sequence[str],
) -> list[Suspect]:
    """Every finding but a refusal, judged by the kernel-support table."""
    shown_release = str(release) if release is not None else None
    return [
        _suspect(f, covered.get(f), shown_release, capabilities)
        for f in findings
        if f.kind is not Kind.REFUSAL
    ]


def _asked(
    source: Source, paths: Sequence[Path], read: tree_reading.Read, quantization: str | None
) -> pending.Scope:
    """The model --model chose, as the pending patches are sorted by it."""
    files = {source.shown(p) for p in paths}
    names = {r.name for r in read.registered}
    unread = census.unread(source, files, bool(names))
    return pending.Scope(
        names, pending.modules_of(read.models, read.registered), files, quantization, unread
    )


def _suspect(
    finding: Finding, covered_by: str | None, release: str | None, capabilities: Sequence[str]
) -> Suspect:
    judgements = judged.judge_all(finding, release, capabilities)
    return Suspect(finding, covered_by, judged.worst(judgements), judgements)


def _current(package_dir: Path, shown: str) -> bytes | None:
    """A file's bytes as the tree holds them now (sglang/...), for coverage's line map."""
    data, _ = read_file(package_dir / shown[len("sglang/") :])
    return data


def _models_asked(source: Source, model: str | None) -> tuple[list[Path], set[str] | None]:
    """The models modules to read, and the class names `--model` chose (None: every class)."""
    if model is not None:
        return census.find_model(source, model)
    return source.python_files(census.models_folder(source)), None


def _rescanner(
    source: Source, helpers: devices.Helpers, package_dir: Path
) -> Callable[[bytes, str], list[Finding]]:
    """Scans a patched file in memory, for coverage: what the patch changes there."""

    def rescan(data: bytes, shown: str) -> list[Finding]:
        try:
            return tree_reading.scan_beside(data, shown, helpers, package_dir)
        except TOO_DEEP:  # the patched file: what the patch covers there is unknown
            source.note(shown, f"{TOO_DEEP_WHY} (once patched)")
            return []

    return rescan


def _as_blocker(suspect: Suspect) -> Blocker:
    """A suspect counted as a blocker (`--strict`)."""
    f = suspect.finding
    listed = [j for j in suspect.judgements if j.outcome is suspect.outcome]
    what = listed[0].what if listed else f"capability 12 gets {f.gets} ({f.kind})"
    when = f"with {suspect.opt_in}" if suspect.opt_in else ""
    every = len(listed) == len(suspect.judgements)  # () says every part judged
    parts = () if every else tuple(j.capability for j in listed)
    return Blocker(what, f"{f.file}:{f.line}", suspect.covered_by, "", when, Origin.SUSPECT, parts)


def _model_report(
    source: Source,
    models: census.Models,
    entry: census.Registered,
    required: dict[str, tuple[str, ...]],
    work: Sequence[coverage.PatchCheck],
) -> ModelReport:
    missing = tuple(sorted(set(required) - models.members(entry.path, entry.name)))
    shown = source.shown(entry.path)
    fixed_by = None
    if missing:
        for check in work:
            if check.after is not None and check.file == shown:
                patched = models.with_file(entry.path, check.after)
                if not set(missing) - patched.members(entry.path, entry.name):
                    fixed_by = check.patch.id
                    break
    return ModelReport(entry.name, shown, missing, fixed_by)
