"""The scanner's findings judged against the kernel-support table (`facts/kernel_support.py`).

What a capability-12 GPU chooses at a decision (`Finding.choices`) is looked up for each
capability asked (12.0, 12.1), for the target's release:

- `fails`: a choice the table says does not run there (or a table keyed by majors without 12);
- `not judged`: a choice the table does not know (None): never counted as a failure;
- `loses`: 12 runs, but 10 gets a choice that runs on 12 too and 12 does not get it;
- `harmless`: the rest: counted, not listed. So is a path that only a flag naming a backend
  that cannot run on 12 leads to (`if decode_backend == "fa3":` on 12): no working run gets there.

A loss is `not judged` when what 12 ends with is decided elsewhere (12 makes no backend choice
at the decision), or when the choice 10 gets runs other kernels on 12 under the same name (the
table's `other_kernel_on`: XQA for trtllm_mha, SGLang's SM120 FA4 port): that 12 loses it is
known, that it would serve the model there is not.

Each judgement says in one line what 12 gets, why it fails there (the table's source, cut
short) and whether only a flag the user passes leads there (opt-in) or it is the default.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import NamedTuple

from sglpatch.doctor.facts import kernel_support, sglang
from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.doctor.findings import Chosen, Finding, Kind, Word
from sglpatch.doctor.read.source_tree import last_name


class Outcome(Word):
    """A judgement's outcome, worst first (a suspect takes its judgements' worst)."""

    FAILS = "fails"
    LOSES = "loses"
    NOT_JUDGED = "not judged"
    HARMLESS = "harmless"


FAILS, LOSES, NOT_JUDGED, HARMLESS = (
    Outcome.FAILS,
    Outcome.LOSES,
    Outcome.NOT_JUDGED,
    Outcome.HARMLESS,
)
LISTED = (FAILS, LOSES)
_ORDER = tuple(Outcome)


class Judgement(NamedTuple):
    """One finding on one capability."""

    capability: str  # "12.0"
    outcome: Outcome
    what: str  # one line: what 12 gets and why it fails (or is not judged) there
    opt_in: str = ""  # the user's flag that leads there; "" when it is the default


def judge(finding: Finding, release: str | None, capability: str) -> Judgement:
    """What `capability` gets at the finding, by the table, for this release."""
    if finding.kind is Kind.TABLE:
        return Judgement(
            capability, FAILS, f"{capability} gets {finding.gets}: the table has no row for 12"
        )
    cap = _capability(capability)
    chosen = [c for c in finding.chosen(capability) if _holds(c, release)]
    if chosen and all(_needs_unrunnable(c.opt_in, cap, release) for c in chosen):
        return Judgement(capability, HARMLESS, "")
    answers = [(c, kernel_support.runs_on(c.kind, c.name, cap, release=release)) for c in chosen]
    failing = [c for c, runs in answers if runs is False]
    if failing:
        first = failing[0]
        opt = first.opt_in if all(c.opt_in for c in failing) else ""
        return Judgement(capability, FAILS, _fails(first, cap, release), opt)
    unknown = [c for c, runs in answers if runs is None]
    if unknown:
        first = unknown[0]
        reason = kernel_support.not_judged().get((first.kind, first.name)) or "unknown there"
        what = f"{capability} gets {_named(first)}: not judged by the table ({_short(reason)})"
        return Judgement(capability, NOT_JUDGED, what, first.opt_in)
    return _loss(finding, chosen, capability, cap, release)


def _loss(
    finding: Finding,
    chosen: Sequence[Chosen],
    capability: str,
    cap: kernel_support.Capability,
    release: str | None,
) -> Judgement:
    """What 12 loses that 10 gets and that runs on 12 too, if anything."""
    got = {(c.kind, c.name) for c in chosen}
    gets = f"gets {', '.join(_named(c) for c in chosen)}" if chosen else finding.gets
    ported: Judgement | None = None
    for other in finding.chosen("10.0"):
        key = (other.kind, other.name)
        if key in got or not _holds(other, release):
            continue
        if not kernel_support.runs_on(other.kind, other.name, cap, release=release):
            continue
        record = kernel_support.lookup(other.kind, other.name, release=release)
        if record is not None and record.ported(cap):
            ported = ported or Judgement(
                capability,
                NOT_JUDGED,
                f"{capability} {gets}; 10 gets {_named(other)}, which {capability} runs as "
                f"{_short(record.other_kernel or '')}: whether that serves this model there is "
                "not established",
                other.opt_in,
            )
            continue
        if not chosen:  # 12 goes on past the decision: what it ends with is chosen elsewhere
            what = (
                f"{capability} {finding.gets}, choosing nothing here; 10 gets {_named(other)}: "
                "what 12 ends with is decided after this block, which doctor does not follow"
            )
            return Judgement(capability, NOT_JUDGED, what, other.opt_in)
        what = f"{capability} {gets}; 10 gets {_named(other)}, which runs on {capability} too"
        return Judgement(capability, LOSES, what, other.opt_in)
    return ported or Judgement(capability, HARMLESS, "")


def judge_all(
    finding: Finding, release: str | None, capabilities: Sequence[str] = CAPABILITIES
) -> tuple[Judgement, ...]:
    return tuple(judge(finding, release, c) for c in capabilities)


def worst(judgements: Sequence[Judgement]) -> Outcome:
    return min((j.outcome for j in judgements), key=_ORDER.index, default=HARMLESS)


def _fails(choice: Chosen, cap: kernel_support.Capability, release: str | None) -> str:
    record = kernel_support.lookup(choice.kind, choice.name, release=release)
    where = record.shown_range() if record is not None else "nothing"
    # The table's own evidence, named as such: it was measured on the builds it names, not
    # read in this environment (which may hold another build, or none).
    source = f"kernel-support table: {_short(record.source)}" if record is not None else ""
    return f"{choice.device} gets {_named(choice)}: runs on {where} only ({source})"


def _named(choice: Chosen) -> str:
    kind, name, via = choice.kind, choice.name, choice.via
    return f"{name} ({kind}, by {via})" if via != name else f"{name} ({kind})"


def _holds(choice: Chosen, release: str | None) -> bool:
    entry = sglang.ENTRIES.get(choice.via)
    return entry is None or entry.holds(release)


def _needs_unrunnable(opt_in: str, cap: kernel_support.Capability, release: str | None) -> bool:
    """Whether a path's opt-in is a backend flag set to backends none of which runs on `cap`
    (`effective_decode_backend == 'fa3'`): the user's own choice fails there first."""
    if not opt_in:
        return False
    try:
        test = ast.parse(opt_in, mode="eval").body
    except SyntaxError:  # cut short ("...") or not an expression
        return False
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if "backend" not in last_name(left):
        return False
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant):
        values = [right.value]
    elif isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        values = [e.value for e in right.elts if isinstance(e, ast.Constant)]
    else:
        return False
    answers = [
        kernel_support.runs_on(kind, value, cap, release=release)
        for value in values
        if isinstance(value, str)
        for kind in kernel_support.KINDS
        if kernel_support.lookup(kind, value, release=release) is not None
    ]
    return bool(answers) and all(a is False for a in answers)


def _capability(text: str) -> kernel_support.Capability:
    major, minor = text.split(".")
    return int(major), int(minor)


def _short(text: str, limit: int = 110) -> str:
    """A table source cut at its first clause, or at `limit` characters."""
    first = text.split("; ")[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."
