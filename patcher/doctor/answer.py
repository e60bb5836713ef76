"""The one door's work: the model asked for, the launch, the checkpoint's quantization, the GPU,
the catalogue, the tree and the environment beside it, read with the collector paused, into one
`Diagnosis`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from sglpatch import catalogue, collector
from sglpatch.doctor import diagnosis, environment, given, next_steps
from sglpatch.doctor.models.asked import model_asked
from sglpatch.doctor.report import Diagnosis
from sglpatch.target import Target


def diagnose(
    target: Target,
    model: str | None,
    catalog: Path | None,
    *,
    model_path: Path | None,
    strict: bool,
    progress: Callable[[str], None] | None,
    capabilities: Sequence[str] | None,
    launch: Sequence[str] | None = None,
    eagle3: bool = False,
    apply_line: str = "sglpatch apply",
    all_models: bool = False,
) -> Diagnosis:
    """`sglpatch.doctor.diagnose`'s answer (its docstring says what the arguments mean)."""
    with collector.paused(settle=True):
        release = str(target.release) if target.release is not None else "(release unknown)"
        named = model is not None or model_path is not None
        parsed = (
            None
            if launch is None
            else given.read_launch(target.package_dir, release, launch, model_given=named)
        )
        path = given.model_path(parsed, model, model_path)
        asked = model_asked(model, path)
        patches = catalogue.load(catalog)
        config = given.read_config(asked.config)
        quantization, read_from = given.quantization(
            target.package_dir, asked.config, config, parsed
        )
        gpu = given.gpu(capabilities)
        flags = {f for p in patches for f in (p.concerns.flag, p.concerns.unless) if f}
        found = diagnosis.diagnose(
            target.package_dir,
            target.release,
            patches,
            asked.model,
            strict=strict,
            progress=progress,
            quantization=quantization,
            capabilities=gpu.capabilities,
            beside=functools.partial(environment.read, target, gpu.capabilities),
            model_from=asked.config,
            config_fields=given.config_fields(config),
            shape=given.shape(config),
            quantization_from=read_from,
            eagle3=given.eagle3_asked(parsed, eagle3),
            launch=None if parsed is None else given.launched(parsed, flags),
            gpu=gpu,
            all_models=all_models,
        )
        return found._replace(next=next_steps.steps(found, parsed, apply_line))
