"""Fixtures doctor's tests share: whole release trees, extracted once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.releases import SEED


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Whole releases, extracted once per session (4,700 files each for the newest)."""
    folder = tmp_path_factory.mktemp("doctor-trees")
    return {r: wheels.full_tree(r, folder / r) for r in (SEED, "0.5.10", "0.5.23")}
