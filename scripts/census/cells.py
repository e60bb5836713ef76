"""What the census evaluates: `sglpatch doctor --all-models` on each release's wheel, extracted,
on both capability-12 parts (the rows doctor gives a user of that release)."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

from sglpatch import doctor
from sglpatch.doctor import ModelRow
from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.target import find_target
from tests.support import wheels  # the development helpers (tests/support)


@cache
def rows(release: str) -> tuple[ModelRow, ...]:
    """Every row of `release`: its served architectures x checkpoints x 12.0 and 12.1."""
    with tempfile.TemporaryDirectory(prefix=f"census-{release}-") as folder:
        site = wheels.full_tree(release, Path(folder) / release)
        found = doctor.diagnose(find_target(site, None), capabilities=CAPABILITIES, all_models=True)
    if found.rows is None:
        raise RuntimeError(f"{release}: doctor gave no rows (release unknown?)")
    return found.rows
