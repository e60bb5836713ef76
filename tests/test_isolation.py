"""The suite never touches the real home, even from fixtures that run before the autouse one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.store import ledger
from tests.conftest import REAL_HOME
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def applied_early(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A module-scoped fixture that applies with a non-default ledger, as some tests' do: it
    registers that ledger in the default one, wherever HOME points at that moment."""
    site = wheels.site_packages(SEED, tmp_path_factory.mktemp("early"), wheels.patch_targets(SEED))
    assert api.apply(site, None, tmp_path_factory.mktemp("other-ledger")).written
    yield ledger.default_directory()


def test_a_module_fixture_writes_nothing_under_the_real_home(applied_early: Path) -> None:
    assert (applied_early / ledger.KNOWN_LEDGERS).is_file()
    assert not applied_early.is_relative_to(REAL_HOME)
    assert not Path.home().is_relative_to(REAL_HOME)
