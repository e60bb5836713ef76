#!/usr/bin/env python3
"""A census at capability 12 of each release's own backend choices (issue #19 point 2).

For every model architecture a release registers (EntryClass in sglang/srt/models/*.py, draft
models left out) and its usual quantizations, runs the release's own default-flag ServerArgs
resolution (tests/support/census.py: `_handle_model_specific_adjustments`, the attention
default, `_handle_moe_kernel_config`, or their 0.5.19+ hooks and override passes) on stand-in
devices of capability 12.0, 12.1 and 10.0, and judges each backend 12 gets with the
kernel-support table (`sglpatch.doctor.facts.kernel_support.runs_on`). One row per gap, grouped,
with a verdict: a catalogue patch that changes the decision (the decision is run again on the
patched source), or "needs a kernel or wheel", or "not a gap" with why.

    .venv/bin/python scripts/sm120_census.py                 # regenerate docs/sm120-census.md
    .venv/bin/python scripts/sm120_census.py --check         # exit 1 if the document is stale
    .venv/bin/python scripts/sm120_census.py --releases 0.5.9 --out /tmp/census.md
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.sm120_census", *sys.argv[1:]])

from sglpatch.doctor.facts import gpus
from sglpatch.doctor.facts.sglang import DRAFT_CLASS
from tests.support import census, wheels  # the development helpers (tests/support)

REPO = Path(__file__).resolve().parent.parent

RELEASES = ["0.5.9", "0.5.16", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
OUT = REPO / "docs" / "sm120-census.md"
SM120 = [gpu.capability for gpu in gpus.ASKED]  # 12.0, 12.1
COMPARE = gpus.B200.capability
QUANTS = ("bf16", "fp8", "modelopt_fp4")
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


def _quiet() -> None:
    sglang = logging.getLogger("sglang")
    sglang.setLevel(logging.CRITICAL)
    sglang.propagate = False


@cache
def architectures(release: str) -> tuple[str, ...]:
    """The EntryClass names of the release's models modules, draft models left out."""
    from sglpatch.doctor.census import summarize

    names: set[str] = set()
    for path in wheels.members(release, "sglang/srt/models/"):
        if path.endswith(".py"):
            names |= set(summarize(wheels.member(release, path), path).entry)
    return tuple(sorted(n for n in names if not DRAFT_CLASS.search(n)))


@cache
def _deciding_text(release: str) -> str:
    return "\n".join(
        wheels.member(release, p).decode()
        for p in wheels.members(release, "sglang/srt/")
        if p.endswith(".py") and census._run_whole(p[:-3].replace("/", "."))
    )


@cache
def dsa_architectures(release: str) -> frozenset[str]:
    """Architectures the release's is_deepseek_nsa / is_deepseek_dsa accept (with index_topk)."""
    import ast

    tree = ast.parse(wheels.member(release, census.MODEL_CONFIG))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in (
            "is_deepseek_nsa",
            "is_deepseek_dsa",
        ):
            found |= {
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant)
                and isinstance(c.value, str)
                and c.value[:1].isupper()
            }
    return frozenset(found)


def variants(release: str, arch: str) -> list[tuple[str, str, dict[str, object]]]:
    """(label, quantization, extra hf_config attributes) to evaluate for one architecture."""
    quants = list(QUANTS)
    text = _deciding_text(release)
    # MXFP4 where the deciding code names the architecture and MXFP4 (GPT-OSS).
    if f'"{arch}"' in text and re.search(rf'"{arch}"(?s:.{{0,4000}})mxfp4', text):
        quants.append("mxfp4")
    found: list[tuple[str, str, dict[str, object]]] = [(q, q, {}) for q in quants]
    if arch in dsa_architectures(release):
        found += [(f"{q} DSA", q, {"index_topk": 2048}) for q in ("bf16", "fp8", "modelopt_fp4")]
    return found


@dataclass(frozen=True)
class Cell:
    release: str
    arch: str
    variant: str
    capability: tuple[int, int]
    outcome: census.Outcome


def run(release: str, replaced: dict[str, bytes] | None = None) -> list[Cell]:
    cells = []
    for capability in (*SM120, COMPARE):
        machine = census.Release(release, capability, replaced or {})
        for arch in architectures(release):
            for label, quant, extra in variants(release, arch):
                cells.append(
                    Cell(release, arch, label, capability, machine.evaluate(arch, quant, extra))
                )
    return cells


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
        if not path or path not in present or not census._run_whole(path[:-3].replace("/", ".")):
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


def _ranges(releases: Sequence[str], among: Sequence[str]) -> str:
    return ", ".join(r for r in among if r in set(releases))


def document(releases: Sequence[str], cells: list[Cell], seconds: float | None = None) -> str:
    found, unjudged, not_evaluated = gaps(cells)
    lines = [
        "# Capability-12 census: each release's own backend choices",
        "",
        "Generated by `scripts/sm120_census.py` (`--check` tells whether it is current); do not",
        "edit by hand. For every architecture a release registers (EntryClass in",
        "`sglang/srt/models/*.py`, NextN/MTP/EAGLE drafts left out) and the quantizations bf16,",
        "block FP8, NVFP4 (modelopt_fp4, as the checkpoint's `quantization_config` names it, no",
        "`--quantization`), MXFP4 where the deciding code names the architecture with MXFP4, and",
        "the DSA form (`index_topk` set) of the architectures the release's `is_deepseek_nsa`/",
        "`is_deepseek_dsa` accept, the release's own default-flag resolution",
        "(`_handle_missing_default_values`, `_handle_cuda_graph_config`,",
        "`_handle_model_specific_adjustments`, `_handle_attention_backend_compatibility`,",
        "`_handle_moe_kernel_config`, or their 0.5.19+ hooks with the override passes they run)",
        "was run on stand-in devices of capability 12.0, 12.1 and 10.0 (tests/support/census.py:",
        "the release's modules from its wheel, its own capability probes, a stand-in ModelConfig).",
        "Each backend 12 gets is judged with the kernel-support table (`docs/kernel-support.md`).",
        "`auto` is not judged (the MoE / GEMM layer resolves it when it loads the weights).",
        "A verdict `forward-fixed by <patch>` means the resolution was run again on the patched",
        "source and then gave a backend the table does not rule out.",
        "",
        f"Releases: {', '.join(releases)}. Evaluations: {len(cells)} "
        f"({sum(1 for c in cells if c.outcome.not_evaluated)} not evaluated).",
        "",
    ]
    verdicts = Counter(
        g.verdict.split(" (")[0] if g.verdict.startswith("forward") else g.verdict.split(":")[0]
        for g in found
    )
    lines += [
        "## Counts per verdict",
        "",
        "| verdict | gap rows (release x architecture x quantization x backend) |",
        "|---|---|",
    ]
    for name, count in sorted(verdicts.items()):
        lines.append(f"| {name} | {count} |")
    lines += ["", "## Gaps", "",
              "| releases | architectures | quantization | 12 gets | on | 10.0 gets | why it fails"
              " | verdict |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple[str, ...], tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for g in found:
        key: tuple[str, ...] = (
            g.variant,
            f"{g.kind} `{g.value}` ({g.field})",
            "/".join(g.capabilities),
            g.compare,
            g.why,
            g.verdict,
        )
        groups[key][0].add(g.release)
        groups[key][1].add(g.arch)
    for key, (rels, archs) in sorted(groups.items(), key=lambda kv: (kv[0][1], sorted(kv[1][1]))):
        variant, gets, caps, compare, why, ver = key
        lines.append(
            f"| {_ranges(sorted(rels), releases)} | {', '.join(sorted(archs))} | {variant} | "
            f"{gets} | {caps} | `{compare}` | {why} | {ver} |"
        )
    lines += [
        "",
        "## Not judged",
        "",
        "Backends 12 gets that the table does not judge (no record, or unknown there):",
        "",
    ]
    lines += [f"- `{name}`: {count} evaluations" for name, count in sorted(unjudged.items())] or [
        "- none"
    ]
    lines += ["", "## Not evaluated", "",
              "Where the stand-ins could not run the release's code to a result"
              " (nothing is guessed):", "",
              "| releases | reason | architectures |", "|---|---|---|"]  # fmt: skip
    reasons: dict[str, tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for cell in not_evaluated:
        reason = re.sub(r":\d+\)", ")", cell.outcome.not_evaluated or "")
        reasons[reason][0].add(cell.release)
        reasons[reason][1].add(f"{cell.arch} ({cell.variant})")
    for reason, (rels, archs) in sorted(reasons.items()):
        lines.append(
            f"| {_ranges(sorted(rels), releases)} | {reason} | {', '.join(sorted(archs))} |"
        )
    if not reasons:
        lines.append("| — | — | — |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES), help="comma-separated")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is stale")
    options = parser.parse_args(argv)
    _quiet()
    releases = [r.strip() for r in options.releases.split(",") if r.strip()]
    started = time.monotonic()
    cells = [cell for release in releases for cell in run(release)]
    text = document(releases, cells)
    if options.check:
        current = options.out.read_text() if options.out.exists() else ""
        if current != text:
            print(f"{options.out} is stale: run scripts/sm120_census.py", file=sys.stderr)
            return 1
        return 0
    options.out.write_text(text)
    print(f"wrote {options.out} ({len(cells)} evaluations, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
