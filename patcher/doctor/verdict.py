"""doctor's answer: will this SGLang run on capability-12 GPUs, with EAGLE-3 on this model?

Blockers are what is known to break: every catalogue patch that still has work on this release
(each declares the `symptom` a capability-12 user sees without it) and the chosen model's
missing EAGLE-3 methods. A patch that edits a models module concerns that model only, so it is a
blocker only when that is the chosen model. The scanner's findings are suspects: listed, counted,
and blockers only under `strict`. A file doctor could not read or parse is not judged: listed,
and the answer cannot be "ready" (what it holds is unknown). Ready means no blockers and every
file judged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from sglpatch.doctor import census, coverage, devices, eagle3, pool, scanner
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source
from sglpatch.patch import Patch
from sglpatch.results import Failed

Progress = Callable[[str], None]


class Blocker(NamedTuple):
    what: str  # one line: what breaks
    source: str  # the catalogue patch that knows it, the model, or the suspect's place
    fixed_by: str | None  # the patch `sglpatch apply` runs to fix it
    note: str = ""  # why apply cannot fix it, when it cannot


class ModelReport(NamedTuple):
    name: str
    module: str  # sglang/srt/models/x.py, where the class is defined
    missing: tuple[str, ...]
    fixed_by: str | None


class Suspect(NamedTuple):
    finding: Finding
    covered_by: str | None


class Diagnosis(NamedTuple):
    release: Version | None
    model: ModelReport | None  # the one --model chose
    blockers: tuple[Blocker, ...]
    suspects: tuple[Suspect, ...]
    refusals: tuple[Finding, ...]  # code that refuses capability 12 with an error, by design
    required: dict[str, tuple[str, ...]]  # EAGLE-3 method -> where the target's code calls it
    models: tuple[ModelReport, ...]  # generation models (all, or those --model chose)
    excluded: dict[str, str]  # registered classes that are no EAGLE-3 target -> why
    strict: bool
    asked: str | None = None  # what --model named
    not_judged: tuple[tuple[str, str], ...] = ()  # (sglang/..., why) of files not read or parsed

    @property
    def ready(self) -> bool:
        return not self.blockers and not self.not_judged

    @property
    def lacking(self) -> list[ModelReport]:
        return [m for m in self.models if m.missing]

    @property
    def verdict(self) -> str:
        subject = "capability 12"
        if self.model is not None or self.asked:
            subject += f" + EAGLE-3 on {self.model.name if self.model else self.asked}"
        where = f"SGLang {self.release}" if self.release else "SGLang, release unknown"
        unjudged = len(self.not_judged)
        files = "1 file" if unjudged == 1 else f"{unjudged} files"
        if self.ready:
            answer = "ready"
        elif not self.blockers:
            answer = f"cannot tell: {files} could not be read or parsed (not judged)"
        else:
            count = len(self.blockers)
            fixable = sum(1 for b in self.blockers if b.fixed_by)
            noun = "blocker" if count == 1 else "blockers"
            if fixable == count:
                answer = (
                    f"{count} {noun}, {'both' if count == 2 else 'all'} fixed by `sglpatch apply`"
                )
                if count == 1:
                    answer = f"1 {noun}, fixed by `sglpatch apply`"
            elif fixable:
                answer = f"{count} {noun}, {fixable} fixed by `sglpatch apply`"
            else:
                answer = f"{count} {noun}, none fixed by `sglpatch apply`"
            if unjudged:
                answer += f"; {files} not judged"
        return f"{subject} ({where}): {answer}"


def diagnose(
    package_dir: Path,
    release: Version | None,
    patches: Sequence[Patch],
    model: str | None = None,
    *,
    strict: bool = False,
    progress: Progress | None = None,
) -> Diagnosis:
    say = progress or (lambda _: None)  # the stages, for a terminal's progress line
    source = Source(package_dir)
    paths, names = _models_asked(source, model)
    helpers = devices.helpers_of(source)
    say("scanning capability gates")
    with pool.Pool() as workers:  # on an error, the workers are stopped, their work dropped
        scan = scanner.Scan(source, helpers, workers)  # git grep runs while the tree is listed
        workers.start(len(scan.listed))
        # Handed over first: loading libcst for the codemods is the largest piece of the work.
        run = workers.run(coverage.check, package_dir, release, patches) if release else None
        say("reading the EAGLE-3 workers")
        required = eagle3.requirements(source)  # while git grep runs
        scan.start()
        say(f"reading {len(paths)} models module(s)")
        models = census.load_models(source, paths)
        registered = [
            r for r in census.registered(source, models, paths) if not names or r.name in names
        ]
        excluded = {r.name: r.excluded for r in registered if r.excluded}
        say("running the catalogue in memory")
        findings = scan.result()
        checks = _ours(run.result(), patches) if run is not None else []
    work = coverage.pending(checks)

    covered = coverage.covered_by(findings, work, _rescanner(source, helpers))
    reports = tuple(
        _model_report(source, models, r, required, work) for r in registered if not r.excluded
    )
    chosen = reports[0] if model is not None and len(reports) == 1 else None

    suspects = tuple(Suspect(f, covered.get(f)) for f in findings if f.kind != "refusal")
    modules = {f"sglang/{p.relative_to(package_dir).as_posix()}" for p in paths}
    blockers = _blockers(work, reports, chosen, model, modules, release)
    if strict:
        blockers += [_as_blocker(s) for s in suspects]
    refusals = tuple(f for f in findings if f.kind == "refusal")
    return Diagnosis(
        release,
        chosen,
        tuple(blockers),
        suspects,
        refusals,
        required,
        reports,
        excluded,
        strict,
        model,
        tuple(sorted(source.not_judged.items())),
    )


def _models_asked(source: Source, model: str | None) -> tuple[list[Path], set[str] | None]:
    """The models modules to read, and the class names `--model` chose (None: every class)."""
    if model is not None:
        return census.find_model(source, model)
    return sorted(census.models_folder(source).glob("*.py")), None


def _rescanner(
    source: Source, helpers: dict[str, frozenset[int]]
) -> Callable[[bytes, str], list[Finding]]:
    """Scans a patched file in memory, for coverage: what the patch changes there."""

    def rescan(data: bytes, shown: str) -> list[Finding]:
        try:
            return scanner.scan_bytes(data, shown, helpers)
        except TOO_DEEP:  # the patched file: what the patch covers there is unknown
            source.note(shown, f"{TOO_DEEP_WHY} (once patched)")
            return []

    return rescan


def _as_blocker(suspect: Suspect) -> Blocker:
    """A suspect counted as a blocker (`--strict`)."""
    f = suspect.finding
    return Blocker(
        f"capability 12 gets {f.gets} ({f.kind})", f"{f.file}:{f.line}", suspect.covered_by
    )


def _blockers(
    work: Sequence[coverage.PatchCheck],
    reports: tuple[ModelReport, ...],
    chosen: ModelReport | None,
    model: str | None,
    chosen_modules: set[str],
    release: Version | None,
) -> list[Blocker]:
    """The pending patches that matter here (another model's fix does not), and the missing
    EAGLE-3 methods of the model asked for."""
    blockers: list[Blocker] = []
    for check in work:
        is_model_patch = check.file.startswith("sglang/srt/models/")
        if is_model_patch and (model is None or check.file not in chosen_modules):
            continue  # another model's fix
        if chosen is not None and chosen.fixed_by == check.patch.id:
            continue  # reported below as the model's missing methods
        if isinstance(check.outcome, Failed):
            blockers.append(
                Blocker(
                    check.patch.symptom,
                    check.patch.id,
                    None,
                    f"the patch fails: {check.outcome.reason}",
                )
            )
        else:
            tested = release is None or check.patch.is_tested(release)
            note = "" if tested else "untested on this release: apply --force"
            blockers.append(Blocker(check.patch.symptom, check.patch.id, check.patch.id, note))
    if model is not None:
        for report in reports:
            if report.missing:
                what = f"EAGLE-3 cannot start: {report.name} lacks {', '.join(report.missing)}"
                blockers.append(Blocker(what, report.name, report.fixed_by))
    return blockers


def _ours(
    checks: Sequence[coverage.PatchCheck], patches: Sequence[Patch]
) -> list[coverage.PatchCheck]:
    """The checks on the caller's own patch objects (a worker answers with copies)."""
    by_id = {patch.id: patch for patch in patches}
    return [check._replace(patch=by_id[check.patch.id]) for check in checks]


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
