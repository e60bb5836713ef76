"""What is known to break on capability 12 where doctor's reading cannot see it, and no patch fixes.

doctor finds failures at capability gates; a kernel called with no gate at all never shows up
there, so after `sglpatch apply` such a model would read "ready" (the DSA indexer's DeepGEMM
MQA-logits calls were one until sm120-dsa-indexer-torch-logits and sm120-dsa-backend-torch-schedule
took them off on 0.5.9 - 0.5.21, and sm120-dsa-indexer-fallback on 0.5.22+).
Each gap here is a fact established from the release trees and public reports (the sources are
named), with the releases, models and parts it holds for. A gap blocks a model that is known to
reach it; one that depends on the checkpoint is listed apart with its condition; some are only
what is known (public reports that disagree), said but never counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.doctor.report import Blocker, Origin


class KnownGap(NamedTuple):
    id: str
    what: str  # one line: what a user sees
    releases: SpecifierSet
    capabilities: tuple[str, ...]  # the parts it holds for
    fix: str  # what would fix it, since `sglpatch apply` does not
    sources: str
    always: frozenset[str] = frozenset()  # model classes that always reach it
    maybe: frozenset[str] = frozenset()  # classes that reach it `when`; both empty: any model
    when: str = ""
    blocks: bool = True  # False: what is known, said but never counted
    # The checkpoints it may be about, as SGLang names their quantization (compressed-tensors:
    # NVFP4 is one of its schemes); empty: any.
    quantization: frozenset[str] = frozenset()
    # Said only of a checkpoint known to be one of `quantization` (a note too narrow to say of
    # every model whose checkpoint is not read).
    only_when_read: bool = False


GAPS: tuple[KnownGap, ...] = (
    KnownGap(
        "minimax-m3-nvfp4-blackwell-only",
        "MiniMax-M3.1 NVFP4 on capability 12 takes the override's Blackwell branch "
        "(`is_blackwell`): MegaMoE with DeepGEMM, or FlashInfer TRT-LLM routed experts, which "
        "the NVFP4 expert method requires there; neither has a build for 12",
        SpecifierSet(">=0.5.23"),
        ("12.0", "12.1"),
        "none known: the release's other branch (Marlin experts, fa3 attention) is Hopper's, "
        "and fa3 does not run on 12 either",
        "0.5.23 arg_groups/model_overrides/minimax_m3.py; sm120-beam-trtllm-mha-fp8-kv's docstring",
        maybe=frozenset({"MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"}),
        when="if the checkpoint is M3.1 NVFP4 (`minimax_m3_nvfp4`)",
    ),
    KnownGap(
        "nvfp4-moe-cutlass-gb10",
        "NVFP4 MoE checkpoints on 12.1 run FlashInfer's CUTLASS MoE: public reports disagree "
        "whether its output is right there (none isolates the kernel; docs/nvfp4-moe-gb10.md)",
        SpecifierSet(">=0.5.11"),
        ("12.1",),
        "if the output is wrong, `--moe-runner-backend marlin` (where the release has it)",
        "docs/nvfp4-moe-gb10.md",
        blocks=False,
        when="if the checkpoint is NVFP4 MoE",
        quantization=frozenset({"modelopt_fp4", "modelopt_mixed", "compressed-tensors"}),
    ),
    KnownGap(
        "modelopt-mixed-fp8-experts-cutlass",
        "a ModelOpt mixed-precision checkpoint whose experts are FP8 (its NVFP4 layers elsewhere) "
        "gets `flashinfer_cutlass` for every MoE layer after `sglpatch apply`, as open PR #35617 "
        "proposes: whether FlashInfer's CUTLASS FP8 MoE runs on 12 is not established",
        SpecifierSet(">=0.5.11"),
        ("12.0", "12.1"),
        "`--moe-runner-backend triton` keeps FP8 experts on Triton",
        "patches/sm120_nvfp4_moe_checkpoint_quant.py's docstring",
        blocks=False,
        when="if the checkpoint's experts are FP8 rather than NVFP4",
        quantization=frozenset({"modelopt_mixed"}),
        only_when_read=True,
    ),
)


class Known(NamedTuple):
    """The gaps that hold for one run of doctor, sorted as its report lists them."""

    blockers: tuple[KnownGap, ...] = ()  # the model asked always reaches it
    conditional: tuple[KnownGap, ...] = ()  # it reaches it `when`
    notes: tuple[KnownGap, ...] = ()  # what is known; without a model, every gap that holds


def known(
    release: Version | None,
    names: set[str] | None,
    capabilities: Sequence[str],
    quantization: str | None = None,
) -> Known:
    """The gaps of `release` on the parts asked, for the classes --model chose (`names`; None:
    no model asked, and every gap is a note about the models it names), less those about
    another quantization than the checkpoint's (`quantization`; None: not known)."""
    if release is None:
        return Known()
    holding = [
        g
        for g in GAPS
        if release in g.releases
        and any(c in g.capabilities for c in capabilities)
        and not (quantization and g.quantization and quantization not in g.quantization)
        and not (g.only_when_read and not quantization)
    ]
    if names is None:
        return Known(notes=tuple(holding))
    blockers, conditional, notes = [], [], []
    for gap in holding:
        any_model = not gap.always and not gap.maybe
        if not gap.blocks:
            if any_model or names & (gap.always | gap.maybe):
                notes.append(gap)
        elif names & gap.always:
            blockers.append(gap)
        elif any_model or names & gap.maybe:
            conditional.append(gap)
    return Known(tuple(blockers), tuple(conditional), tuple(notes))


def rows(
    release: Version | None,
    names: set[str] | None,
    capabilities: Sequence[str],
    quantization: str | None = None,
) -> tuple[list[Blocker], list[Blocker], tuple[Blocker, ...]]:
    """`known` as the report's rows: blockers, rows apart with their condition, notes."""
    found = known(release, names, capabilities, quantization)

    def row(gap: KnownGap, when: str = "") -> Blocker:
        note = f"fix: {gap.fix}; sources: {gap.sources}"
        parts = tuple(c for c in capabilities if c in gap.capabilities)
        parts = () if len(parts) == len(capabilities) else parts  # (): every part judged
        return Blocker(gap.what, gap.id, None, note, when, Origin.GAP, parts)

    return (
        [row(g) for g in found.blockers],
        [row(g, g.when) for g in found.conditional],
        tuple(row(g) for g in found.notes),  # each says what it is about
    )
