from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.sm120_symm_mem_sizes import Sm120SymmMemSizes
from sglpatch.results import Applied
from tests.support import proofs, wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

SIZES = f"{wheels.COMMUNICATORS}/all_reduce_utils.py"
COMMUNICATOR = f"{wheels.COMMUNICATORS}/torch_symm_mem.py"

pytestmark = pytest.mark.wheel


def table_name(release: Version) -> str:
    return (
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
        if release >= Version("0.5.4.post3")
        else "SYMM_MEM_ALL_REDUCE_MAX_SIZES"
    )


def matrix_expected(release: Version) -> str:
    return "applied"  # no release up to 0.5.23 has a row for 12


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    sizes = proofs.size_table(patched[SIZES], table_name(release))
    assert sizes[12] == sizes[10]


def test_capability_12_gets_the_sizes_of_10_and_nothing_else_changes() -> None:
    source = wheels.member(SEED, SIZES)
    change, outcomes = engine.transform_source(source, SIZES, [Sm120SymmMemSizes()], Version(SEED))
    assert isinstance(outcomes["sm120-symm-mem-sizes"], Applied) and change is not None
    before = proofs.size_table(source, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    after = proofs.size_table(change.after, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    assert 12 not in before
    assert (
        after[12]
        == before[10]
        == {2: 64 * proofs.MiB, 4: 64 * proofs.MiB, 6: 128 * proofs.MiB, 8: 128 * proofs.MiB}
    )
    assert {k: v for k, v in after.items() if k != 12} == before


def test_the_communicator_reads_the_new_row() -> None:
    """Unpatched, capability 12 dies with KeyError; with the row it gets capability 10's sizes."""
    communicator = wheels.member(SEED, COMMUNICATOR)
    sizes = wheels.member(SEED, SIZES)
    with pytest.raises(KeyError, match="12"):
        proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 12, 8)
    change, _ = engine.transform_source(sizes, SIZES, [Sm120SymmMemSizes()], Version(SEED))
    assert change is not None
    # The size row alone gets past __init__; all_reduce still needs the two-shot patch.
    with pytest.raises(KeyError, match="12"):
        proofs.communicator_run(communicator, change.after, "TorchSymmMemCommunicator", 12, 8)


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
