"""The checkpoints evaluated for one architecture: its usual quantizations, and its DSA form.

Every architecture in bf16 (no `quantization_config`), block FP8 and NVFP4 (`modelopt_fp4`), as a
checkpoint's `quantization_config` names them; MXFP4 for the families published in it (GPT-OSS);
and, for the architectures the release's `is_deepseek_nsa` /
`is_deepseek_dsa` accept, the same three with `index_topk` set (DeepSeek-V3.2, GLM-5). Where
the family's published config.json is recorded (`facts/model_configs.json`), its fields are set.
"""

from __future__ import annotations

import ast
import functools
from typing import Any, NamedTuple

from sglpatch.doctor.facts.model_configs import Family, family
from sglpatch.doctor.resolve.files import ReleaseFiles
from sglpatch.doctor.resolve.model import CHECKPOINTS, MODEL_CONFIG

USUAL = ("bf16", "fp8", "modelopt_fp4")
# Families published as MXFP4 checkpoints (openai/gpt-oss-20b and -120b); SGLang decides their
# MoE runner from that quantization.
MXFP4 = frozenset({"GptOssForCausalLM"})
DSA_TOPK = 2048  # DeepSeek-V3.2's index_topk; any value makes the model a DSA one


class Variant(NamedTuple):
    """One checkpoint of an architecture: its quantization as CHECKPOINTS names it, and the
    hf_config attributes beside `architectures`."""

    checkpoint: str  # a key of CHECKPOINTS: bf16, fp8, modelopt_fp4, mxfp4
    form: str | None = None  # "dsa": the DSA form
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def quantization(self) -> str | None:
        """As SGLang names it (`ModelConfig.quantization`); None: unquantized."""
        return CHECKPOINTS[self.checkpoint][1]

    @property
    def label(self) -> str:
        return f"{self.checkpoint} DSA" if self.form == "dsa" else self.checkpoint


def variants(files: ReleaseFiles, arch: str) -> list[Variant]:
    checkpoints = [*USUAL, "mxfp4"] if arch in MXFP4 else list(USUAL)
    plain = family(arch, dsa=False)
    fields = _fields(plain) if plain else ()
    found = [Variant(c, None, fields) for c in checkpoints]
    if arch in dsa_architectures(files):
        dsa = family(arch, dsa=True)
        fields = _fields(dsa) if dsa else (("index_topk", DSA_TOPK),)
        found += [Variant(c, "dsa", fields) for c in USUAL]
    return found


def _fields(recorded: Family) -> tuple[tuple[str, Any], ...]:
    """The family's published fields, but its quantization: each checkpoint sets its own."""
    return tuple((k, v) for k, v in recorded.set_fields().items() if k != "quantization_config")


@functools.lru_cache(maxsize=8)
def dsa_architectures(files: ReleaseFiles) -> frozenset[str]:
    """Architectures the release's is_deepseek_nsa / is_deepseek_dsa accept (with index_topk)."""
    found: set[str] = set()
    try:
        tree = files.tree(MODEL_CONFIG)
    except (KeyError, SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()  # then the resolution itself says why it cannot be evaluated
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
