"""`sglpatch doctor`: read an SGLang tree's own source (never import it) and answer whether it runs
on capability-12 GPUs, with EAGLE-3 on a given model.

`diagnose` is the one door: it returns the whole answer, a `Diagnosis` (kernels included). The
API, the terminal and the JSON writer import this package and nothing below it; the names they
need are here. `docs/doctor-internals.md` draws the layout and holds the glossary.

Importing this package loads none of doctor's readers: every command imports it at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.errors import UsageError

if TYPE_CHECKING:
    from sglpatch.doctor.findings import Finding as Finding
    from sglpatch.doctor.findings import Kind as Kind
    from sglpatch.doctor.kernels import KernelFinding as KernelFinding
    from sglpatch.doctor.report import Blocker as Blocker
    from sglpatch.doctor.report import Diagnosis as Diagnosis
    from sglpatch.doctor.report import GpuChoice as GpuChoice
    from sglpatch.doctor.report import Launched as Launched
    from sglpatch.doctor.report import ModelReport as ModelReport
    from sglpatch.doctor.report import ModelRow as ModelRow
    from sglpatch.doctor.report import Step as Step
    from sglpatch.doctor.report import Suspect as Suspect
    from sglpatch.target import Target

__all__ = [
    "CAPABILITIES",
    "Blocker",
    "Diagnosis",
    "Finding",
    "GpuChoice",
    "KernelFinding",
    "Kind",
    "Launched",
    "ModelReport",
    "ModelRow",
    "Step",
    "Suspect",
    "capabilities",
    "diagnose",
    "render_kernels",
]


def diagnose(
    target: Target,
    model: str | None = None,
    catalog: Path | None = None,
    *,
    model_path: Path | None = None,
    strict: bool = False,
    progress: Callable[[str], None] | None = None,
    capabilities: Sequence[str] | None = CAPABILITIES,
    launch: Sequence[str] | None = None,
    eagle3: bool = False,
    apply_line: str = "sglpatch apply",
    all_models: bool = False,
) -> Diagnosis:
    """Will `target` run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`), a models module's
    stem (`kimi_k25`) or a Hugging Face id (`moonshotai/Kimi-K2.5`, read in the local hub
    cache); `model_path` is a checkpoint folder whose config.json names it, or a Hugging Face
    id when no such folder exists (as SGLang's own --model-path). `catalog` is the catalogue's
    folder (None: the installed one); `capabilities` the parts asked about (`capabilities()`),
    or None: those `nvidia-smi` reports (both where it does not answer or reports no part of 12).
    `launch` is what the user gives `python -m sglang.launch_server` (or the whole command),
    parsed with the release's own options; its `--model-path` names the model. The model's
    missing EAGLE-3 methods are blockers only when `eagle3` or the launch's
    `--speculative-algorithm EAGLE3` asks for EAGLE-3. `apply_line` is `sglpatch apply` with the
    options the user gave (the first of `Diagnosis.next`, when apply has work). `all_models`:
    `Diagnosis.rows` for every architecture the release serves (with `model`, its rows alone
    are there either way).
    """
    if all_models and (model is not None or model_path is not None):
        raise UsageError("--all-models judges every model: give it without --model/--model-path")
    from sglpatch.doctor import answer  # its readers load only when doctor runs

    return answer.diagnose(
        target,
        model,
        catalog,
        model_path=model_path,
        strict=strict,
        progress=progress,
        capabilities=capabilities,
        launch=launch,
        eagle3=eagle3,
        apply_line=apply_line,
        all_models=all_models,
    )


def capabilities(capability: str | None) -> tuple[str, ...]:
    """The capabilities `--capability` asks about: one of `CAPABILITIES`, or both (None)."""
    if capability is None:
        return CAPABILITIES
    if capability not in CAPABILITIES:
        raise UsageError(f"--capability {capability}: one of {', '.join(CAPABILITIES)}")
    return (capability,)


def render_kernels(found: Sequence[KernelFinding], asked: Sequence[str]) -> list[str]:
    """The kernels section's lines for the terminal, one package in a few lines each."""
    from sglpatch.doctor import kernels

    return kernels.render(found, asked)


# The value types, loaded on first use (their modules import the kernel-support table).
_TYPES = {
    "Blocker": "report",
    "GpuChoice": "report",
    "Launched": "report",
    "Step": "report",
    "Diagnosis": "report",
    "ModelReport": "report",
    "ModelRow": "report",
    "Suspect": "report",
    "Finding": "findings",
    "Kind": "findings",
    "KernelFinding": "kernels",
}


def __getattr__(name: str) -> Any:
    if name in _TYPES:
        return getattr(importlib.import_module(f"sglpatch.doctor.{_TYPES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
