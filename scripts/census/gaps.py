"""The backends capability 12 gets and cannot run, judged with the kernel-support table, each
with a verdict: a catalogue patch that changes the choice, a kernel it needs, or still open."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from scripts.census.cells import COMPARE, SM120, Cell, variants
from tests.support import census, wheels  # the development helpers (tests/support)

# Values that are not a kernel: "auto" is resolved later, by the layer that loads the weights;
# "nsa"/"dsa" dispatch to the DSA prefill/decode backends, which are judged themselves.
NOT_KERNELS = {"auto", "nsa", "dsa"}
# Judgements the table alone cannot make, with the evidence (kind, backend, releases, why).
# None at present: flashinfer_mxfp4 on 0.5.17+, the one there was, is now the table's own reading
# (its SM120 CUTLASS branch, patcher/doctor/facts/kernel_support.json).
NOT_A_GAP: list[tuple[str, str, str, str]] = []


# Gaps no source patch can close: the model itself requires what 12 cannot run (architecture,
# kind, backend, releases, why).
NEEDS_KERNEL = [
    (
        "IQuestQ1ForCausalLM",
        "attention",
        "fa3",
        ">=0.5.21",
        "needs a kernel: IQuestQ1 applies its attention sink from the softmax LSE and requires "
        "FA3 for prefill and decode (its override in arg_groups/model_overrides/iquest_q1.py "
        "raises for any other backend); FA3 has no capability-12 build",
    ),
]


def _shown(capability: tuple[int, int]) -> str:
    return "{}.{}".format(*capability)


def judge(
    kind: str, field: str, value: str, capability: tuple[int, int], release: str
) -> bool | None:
    from sglpatch.doctor.facts import kernel_support as support

    if value in NOT_KERNELS:
        return None
    name = support.gemm_name(field.split("_")[0], value) if kind == "gemm" else value
    return support.runs_on(kind, name, capability, release=release)


def _why(kind: str, field: str, value: str, release: str) -> str:
    from sglpatch.doctor.facts import kernel_support as support

    name = support.gemm_name(field.split("_")[0], value) if kind == "gemm" else value
    record = support.lookup(kind, name, release)
    assert record is not None
    return f"table: {kind}/{name} runs on {record.shown_range()} ({record.source[:220]})"


@cache
def _census_patches(release: str) -> list[tuple[str, str, bytes]]:
    """(patch id, wheel path, patched source) for each catalogue patch that applies on
    `release` to a file the census runs."""
    from packaging.version import Version

    from sglpatch import catalogue, engine
    from sglpatch.results import Applied

    found = []
    version = Version(release)
    present = set(wheels.members(release))
    for patch in catalogue.load():
        target = patch.target_file(version)
        path = f"sglang/{target}" if target else None
        if not path or path not in present or not census.run_whole(path[:-3].replace("/", ".")):
            continue
        try:
            change, outcomes = engine.transform_source(
                wheels.member(release, path), path, [patch], version
            )
        except Exception:  # an unfinished patch elsewhere in the tree: not a fix we can prove
            continue
        if change is not None and isinstance(outcomes.get(patch.id), Applied):
            found.append((patch.id, path, change.after))
    return found


@cache
def _patched_machine(release: str, capability: tuple[int, int], patch_id: str) -> census.Release:
    (entry,) = [e for e in _census_patches(release) if e[0] == patch_id]
    return census.Release(release, capability, {entry[1]: entry[2]})


def verdict(cell: Cell, kind: str, field: str, value: str) -> str:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for note_kind, note_value, spec, why in NOT_A_GAP:
        if (note_kind, note_value) == (kind, value) and Version(cell.release) in SpecifierSet(spec):
            return why
    for arch, note_kind, note_value, spec, why in NEEDS_KERNEL:
        if (arch, note_kind, note_value) == (cell.arch, kind, value) and Version(
            cell.release
        ) in SpecifierSet(spec):
            return why
    quant = dict((label, (q, extra)) for label, q, extra in variants(cell.release, cell.arch))[
        cell.variant
    ]
    for patch_id, _, _ in _census_patches(cell.release):
        outcome = _patched_machine(cell.release, cell.capability, patch_id).evaluate(
            cell.arch, *quant
        )
        now = {f: v for k, f, v in outcome.choices if k == kind}
        if outcome.not_evaluated is None and now.get(field) != value:
            after = now.get(field)
            if (
                after is not None
                and judge(kind, field, after, cell.capability, cell.release) is not False
            ):
                return f"forward-fixed by {patch_id} (then {after})"
    return "open: no catalogue patch changes this choice yet (a forward fix to write)"


@dataclass(frozen=True)
class Gap:
    release: str
    arch: str
    variant: str
    capabilities: tuple[str, ...]
    kind: str
    field: str
    value: str
    compare: str
    why: str
    verdict: str


def gaps(cells: Iterable[Cell]) -> tuple[list[Gap], Counter[str], list[Cell]]:
    by_key: dict[tuple[str, str, str], dict[tuple[int, int], Cell]] = defaultdict(dict)
    for cell in cells:
        by_key[cell.release, cell.arch, cell.variant][cell.capability] = cell
    found: list[Gap] = []
    unjudged: Counter[str] = Counter()
    not_evaluated: list[Cell] = []
    for (release, arch, variant), row in sorted(by_key.items()):
        compare = row[COMPARE].outcome
        failing: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        for capability in SM120:
            cell = row[capability]
            if cell.outcome.not_evaluated:
                not_evaluated.append(cell)
                continue
            for kind, field, value in cell.outcome.choices:
                answer = judge(kind, field, value, capability, release)
                if answer is None and value not in NOT_KERNELS:
                    unjudged[f"{kind}/{value}"] += 1
                if answer is False:
                    failing[kind, field, value].append(_shown(capability))
        for (kind, field, value), caps in failing.items():
            there = {f: v for k, f, v in compare.choices}.get(field, "—")
            cell = row[SM120[0]] if "12.0" in caps else row[SM120[1]]
            why = _why(kind, field, value, release)
            judged = verdict(cell, kind, field, value)
            found.append(
                Gap(release, arch, variant, tuple(caps), kind, field, value, there, why, judged)
            )
    return found, unjudged, not_evaluated
