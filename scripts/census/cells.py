"""What the census evaluates: every architecture a release registers, in its usual
quantizations, through the release's own default-flag resolution on a stand-in device."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from sglpatch.doctor.facts import gpus
from sglpatch.doctor.facts.sglang import DRAFT_CLASS
from tests.support import census, wheels  # the development helpers (tests/support)

SM120 = [gpu.capability for gpu in gpus.ASKED]  # 12.0, 12.1
COMPARE = gpus.B200.capability
QUANTS = ("bf16", "fp8", "modelopt_fp4")


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
        if p.endswith(".py") and census.run_whole(p[:-3].replace("/", "."))
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
