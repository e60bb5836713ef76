"""`doctor`: will the target run on capability-12 GPUs, with EAGLE-3 on a model? From its source.

This module finds the target and asks `sglpatch.doctor`, whose answer is whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from sglpatch import doctor
from sglpatch.reports import DoctorReport
from sglpatch.target import find_target, parse_release


def diagnose(
    target_path: Path | None,
    model: str | None = None,
    catalog: Path | None = None,
    *,
    model_path: Path | None = None,
    strict: bool = False,
    progress: Callable[[str], None] | None = None,
    version: str | None = None,
    capability: str | None = None,
    launch: Sequence[str] | None = None,
    eagle3: bool = False,
    apply_line: str = "sglpatch apply",
    all_models: bool = False,
) -> DoctorReport:
    """Will the target run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`), a models module's
    stem (`kimi_k25`) or a Hugging Face id (`moonshotai/Kimi-K2.5`, read in the local hub
    cache); `model_path` is a checkpoint folder whose config.json names it, or a Hugging Face
    id when no such folder exists (as SGLang's own --model-path). A release that cannot be read
    is a usage error unless `version` gives it: which patches the tree needs depends on it, so
    "ready" could not be known. `capability` ("12.0" or "12.1") asks about one part; None:
    the parts nvidia-smi reports, or both. `launch`: the launch's arguments (or whole command),
    parsed with the release's own options; `eagle3`: judge EAGLE-3 without a launch;
    `apply_line`: `sglpatch apply` with the options the user gave (for `Diagnosis.next`);
    `all_models`: a row per architecture the release serves (`Diagnosis.rows`).
    """

    capabilities = doctor.capabilities(capability) if capability is not None else None
    target = find_target(target_path, parse_release(version) if version else None)
    found = doctor.diagnose(
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
    return DoctorReport(target, found, found.kernels, found.kernels_from, found.model_from)
