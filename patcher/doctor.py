"""`doctor`: read an SGLang tree's own source (never import it) for what stops it on capability-12
GPUs and on EAGLE-3 speculative decoding.

EAGLE-3 readiness is derived from the target's code, not from a list in sglpatch: the methods the
EAGLE workers call on the target model, and the methods the model runner calls on its model on
the EAGLE path, are required of every registered model class (following base classes defined
inside SGLang). Capability gaps are tables keyed by compute-capability majors that know 9 or 10
but not 12, and equality gates (`== 10`, `!= 9`, `in (9, 10)`) on a capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sglpatch import capability_gaps, eagle3_readiness
from sglpatch.patch import Patch
from sglpatch.source_tree import Source


@dataclass(frozen=True)
class ModelReport:
    name: str
    module: str  # relative to the target root's sglang/ parent, e.g. sglang/srt/models/x.py
    missing: tuple[str, ...]
    fixed_by: str | None


@dataclass(frozen=True)
class Gap:
    file: str
    line: int
    kind: str  # table or gate
    code: str
    covered_by: str | None


@dataclass(frozen=True)
class Diagnosis:
    release: Version | None
    required: dict[str, tuple[str, ...]]  # method -> where the target's code calls it
    models: tuple[ModelReport, ...]
    gaps: tuple[Gap, ...]

    @property
    def lacking(self) -> list[ModelReport]:
        return [m for m in self.models if m.missing]

    @property
    def healthy(self) -> bool:
        return not self.lacking and not self.gaps


def diagnose(
    package_dir: Path,
    release: Version | None,
    patches: Sequence[Patch],
    model: str | None = None,
) -> Diagnosis:
    source = Source(package_dir)
    patched_files = _patch_files(patches, release)
    required = eagle3_readiness.requirements(source)
    models = tuple(
        ModelReport(
            name,
            source.shown(path),
            missing := tuple(sorted(set(required) - methods)),
            patched_files.get(source.shown(path)) if missing else None,
        )
        for path, name, methods in eagle3_readiness.registered_models(source, model)
    )
    gaps = tuple(
        Gap(file, line, kind, code, patched_files.get(file))
        for file, line, kind, code in capability_gaps.find(source)
    )
    return Diagnosis(release, required, models, gaps)


def _patch_files(patches: Sequence[Patch], release: Version | None) -> dict[str, str]:
    """File -> the catalogue patch that edits it on this release (and is not upstream yet)."""
    if release is None:
        return {}
    files = {}
    for patch in patches:
        path = patch.target_file(release)
        if path is not None and not patch.fixed_upstream(release):
            files[f"sglang/{path}"] = patch.id
    return files
