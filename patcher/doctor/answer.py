"""The one door's work: the model asked for, the catalogue, the tree and the environment beside
it, read with the collector paused, into one `Diagnosis`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from sglpatch import catalogue, collector
from sglpatch.doctor import diagnosis, environment
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
    capabilities: Sequence[str],
) -> Diagnosis:
    """`sglpatch.doctor.diagnose`'s answer (its docstring says what the arguments mean)."""
    with collector.paused(settle=True):
        asked = model_asked(model, model_path)
        return diagnosis.diagnose(
            target.package_dir,
            target.release,
            catalogue.load(catalog),
            asked.model,
            strict=strict,
            progress=progress,
            capabilities=capabilities,
            beside=functools.partial(environment.read, target, capabilities),
            model_from=asked.config,
        )
