"""Each command's result as plain JSON-ready data: the schemas docs/json.md documents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglpatch import api
from sglpatch.reports import tally
from sglpatch.results import AlreadyApplied, Failed, NotApplicable, Outcome
from sglpatch.target import Target

if TYPE_CHECKING:
    from sglpatch.doctor import Blocker, Diagnosis, Finding, Suspect

JSON = dict[str, Any]


def _target(target: Target) -> JSON:
    return {
        "target": str(target.root),
        "layout": target.layout.value,
        "release": str(target.release) if target.release else None,
        "release_source": target.release_source,
        "found_by": target.found_by,
        "also_found": list(target.also_found),
    }


def outcome(item: Outcome) -> JSON:
    data: JSON = {"id": item.patch_id, "state": item.state}
    if isinstance(item, AlreadyApplied):
        data |= {"file": item.file, "detail": item.detail}
        data["fixed_in"] = str(item.fixed_in) if item.fixed_in else None
    elif isinstance(item, NotApplicable):
        data["reason"] = item.reason
    elif isinstance(item, Failed):
        data |= {"file": item.file, "reason": item.reason}
    else:
        data["file"] = item.file
    return data


def apply(report: api.ApplyReport, dry_run: bool) -> JSON:
    return {
        **_target(report.target),
        "ledger": str(report.ledger),
        "dry_run": dry_run,
        "written": report.written,
        "commit": report.commit,
        "changed": list(report.changed),
        "patches": [outcome(o) for o in report.outcomes],
        "untested": list(report.untested),
        "finished_interrupted": report.finished,
        "diff": report.diff,
        "counts": _counts(
            [o.state for o in report.outcomes], files=len(report.changed), of=_OUTCOMES
        ),
    }


# The states each command's `counts` always has (0 when none), keyed with underscores.
_OUTCOMES = ("applied", "already applied", "already upstream", "failed", "not for this release")
_ROWS = (
    "applied",
    "not applied",
    "already upstream",
    "skipped",
    "edited since applied",
    "patched",
    "not for this release",
)


def _counts(states: list[str], of: tuple[str, ...], **more: int) -> JSON:
    """How many patches are in each state (every state of `of`, and any other seen), and `more`."""
    seen = tally(states)
    return {
        **{s.replace(" ", "_"): seen.get(s, 0) for s in of},
        **{s.replace(" ", "_"): n for s, n in seen.items() if s not in of},
        **more,
    }


def revert(report: api.RevertReport) -> JSON:
    return {
        **_target(report.target),
        "ledger": str(report.ledger),
        "restored": list(report.restored),
        "already_original": list(report.untouched),
        "saved_edits": list(report.saved_edits),
        "left": list(report.left),
        "commit": report.commit,
        "finished_interrupted": report.finished,
        "patches": list(report.patches),
        "counts": {
            "restored": len(report.restored),
            "already_original": len(report.untouched),
            "patches": len(report.patches),
        },
    }


def status(report: api.StatusReport) -> JSON:
    return {
        **_target(report.target),
        "ledger": str(report.ledger),
        "interrupted": report.interrupted,
        "patches": [
            {"id": p.id, "state": p.state, "file": p.file, "note": p.note} for p in report.patches
        ],
        "counts": _counts([p.state for p in report.patches], of=_ROWS),
    }


def check(report: api.CheckReport) -> JSON:
    return {
        **_target(report.target),
        "ledger": str(report.ledger),
        "ok": report.ok,
        "in_place": list(report.in_place),
        "missing": [{"id": m.id, "file": m.file, "reason": m.note} for m in report.missing],
        "skipped": list(report.skipped),
        "not_for_this_release": list(report.not_needed),
        "already_upstream": list(report.upstream),
        "upgraded_from": report.upgraded_from,
        "counts": {
            "in_place": len(report.in_place),
            "applied": len(report.applied),
            "already_upstream": len(report.upstream),
            "missing": len(report.missing),
            "skipped": len(report.skipped),
            "not_for_this_release": len(report.not_needed),
        },
    }


def log(report: api.LogReport) -> JSON:
    return {
        "found_by": report.target.found_by,
        "also_found": list(report.target.also_found),
        "ledger": str(report.ledger),
        "entries": [
            {"commit": e.commit, "date": e.date, "summary": e.summary, "message": e.message}
            for e in report.entries
        ],
    }


def catalogue(rows: list[api.CatalogueRow], release: str | None) -> JSON:
    return {
        "release": release,
        "patches": [
            {
                "id": r.id,
                "description": r.description,
                "tested": r.tested,
                "fixed_upstream_in": r.fixed_upstream_in,
                "origin": r.origin,
                **({"file": r.file, "outlook": r.outlook, "effect": r.effect} if release else {}),
            }
            for r in rows
        ],
    }


def doctor(report: api.DoctorReport) -> JSON:
    found = report.diagnosis
    models: JSON = {}
    for model in found.models:
        key = model.name if model.name not in models else f"{model.name} ({model.module})"
        models[key] = {
            "module": model.module,
            "missing": list(model.missing),
            "fixed_by": model.fixed_by,
        }
    return {
        "schema": DOCTOR_SCHEMA,
        "capabilities": list(found.capabilities),
        "release": str(found.release) if found.release else None,
        "target": str(report.target.root),
        "found_by": report.target.found_by,
        "also_found": list(report.target.also_found),
        "verdict": found.verdict,
        "ready": found.ready,
        "strict": found.strict,
        "model": found.model.name if found.model else None,
        "model_from": str(report.model_from) if report.model_from else None,
        "blockers": [_blocker(b) for b in found.blockers],
        "opt_in": [_blocker(b) for b in found.opt_in],
        "tables": [_blocker(b) for b in found.tables],
        "known": [_blocker(b) for b in found.known],
        "not_for_this_model": list(found.elsewhere),
        "not_judged_for_this_model": list(found.undecided),
        "quantization": found.quantization,
        "quantization_from": found.quantization_from or None,
        "launch": None
        if found.launch is None
        else {"model_path": found.launch.model_path, "flags": dict(found.launch.flags)},
        "gpu": _gpu(found),
        "eagle3_asked": found.eagle3,
        "draft": found.draft,
        "eagle3": {
            "required": list(found.required),
            "called_at": {method: list(places) for method, places in found.required.items()},
            "models": models,
            "excluded": dict(found.excluded),
        },
        "suspects": [_suspect(s) for s in found.suspects],
        "suspects_not_judged": [_suspect(s) for s in found.unjudged],
        "suspects_harmless": found.harmless,
        "refusals": [_finding(f) for f in found.refusals],
        # `file` ends with "/" for a folder that could not be listed
        "not_judged": [{"file": u.file, "why": u.why} for u in found.not_judged],
        "kernels": None if report.kernels is None else [k.to_json() for k in report.kernels],
        "kernels_from": str(report.kernels_from) if report.kernels_from else None,
        # What to run next, in order (the text's "Next:" section): [] when nothing is to do.
        "next": [{"command": s.command, "why": s.why} for s in found.next],
        # One row per model, checkpoint and part (--all-models, or the model --model chose);
        # null: not evaluated (no model asked, or the release unknown).
        "models": None if found.rows is None else [r._asdict() for r in found.rows],
    }


# 2: suspects are judged against the kernel-support table: `suspects` lists only those that
# fail (or lose a path that runs) on a capability asked, each with `verdict`, `what`, `opt_in`
# and, where 12.0 and 12.1 are judged apart, `by_capability`; `suspects_not_judged` and the
# count `suspects_harmless` are new, as are `capabilities` and the kind `decides`.
# 3: `models`, the rows of --all-models (or of the model --model chose): each
# `architecture`, `quantization`, `form`, `capability`, `now`, `after_apply`, `patches`, `why`,
# `file`, `line`.
DOCTOR_SCHEMA = 3


def _suspect(suspect: Suspect) -> JSON:
    listed = [j for j in suspect.judgements if j.outcome == suspect.outcome]
    data: JSON = {
        **_finding(suspect.finding),
        "covered_by": suspect.covered_by,
        "verdict": suspect.outcome,
        "what": listed[0].what if listed else "",
        "opt_in": suspect.opt_in or None,
    }
    if suspect.differs:
        data["by_capability"] = {
            j.capability: {"verdict": j.outcome, "what": j.what, "opt_in": j.opt_in or None}
            for j in suspect.judgements
        }
    return data


def _gpu(found: Diagnosis) -> JSON:
    gpu = found.gpu
    return {
        "capabilities": list(found.capabilities),
        "from": gpu.source if gpu is not None else None,
        "present": list(gpu.present) if gpu is not None else [],
        "note": gpu.note if gpu is not None else "",
    }


def _blocker(blocker: Blocker) -> JSON:
    return {
        "what": blocker.what,
        "source": blocker.source,
        "fixed_by": blocker.fixed_by,
        "note": blocker.note,
        "when": blocker.when,
        "parts": list(blocker.parts) or None,
    }


def _finding(finding: Finding) -> JSON:
    return {
        "file": finding.file,
        "line": finding.line,
        "kind": finding.kind,
        "code": finding.code,
        "gets": finding.gets,
        "like": finding.like,
        "gets_12_1": finding.gets_121 or None,
    }
