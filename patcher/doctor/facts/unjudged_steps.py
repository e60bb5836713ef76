"""Steps of a model's path that nothing in sglpatch judges on capability 12 yet, by checkpoint
and release: a row that reaches one is "not evaluated" there, never "runs".

Each is named where the evaluation stops (`docs/models-on-12.md` holds the same, by family), so
that `doctor --all-models` says which step was not judged instead of counting it as passed.
"""

from __future__ import annotations

from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version


class Unjudged(NamedTuple):
    why: str  # the step, and why it is not judged
    releases: SpecifierSet
    quantization: str | None = None  # the checkpoint's (SGLang's name); None: any
    form: str | None = None  # "dsa": the DSA form only
    moe: bool = False  # only for classes with MoE layers


STEPS: tuple[Unjudged, ...] = (
    Unjudged(
        "run time: the block-FP8 linear's GEMM on 12 (`fp8:cutlass`, whose arch list is not "
        "read) is not judged",
        SpecifierSet(">=0.5.16"),
        quantization="fp8",
    ),
    Unjudged(
        "load time: the NVFP4 MoE method resolves `auto` when it loads the weights, and no "
        "release before 0.5.11 names a backend there: not judged",
        SpecifierSet("<0.5.11"),
        quantization="modelopt_fp4",
        moe=True,
    ),
    Unjudged(
        "run time: the DSA indexer's TileLang act_quant, index-K cache store and top-k kernels "
        "are not judged on 12 (its MQA logits are: torch after apply)",
        SpecifierSet(">=0.5.9"),
        form="dsa",
    ),
)


def steps(release: Version, quantization: str | None, form: str | None, moe: bool) -> list[str]:
    """Why each step a checkpoint of `release` reaches is not judged (`moe`: the class has
    MoE layers)."""
    return [
        step.why
        for step in STEPS
        if release in step.releases
        and (step.quantization is None or step.quantization == quantization)
        and (step.form is None or step.form == form)
        and (moe or not step.moe)
    ]
