from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.sm120_symm_mem_sizes import Sm120SymmMemSizes
from sglpatch.patches.sm120_symm_mem_two_shot import Sm120SymmMemTwoShot
from sglpatch.results import AlreadyApplied, Applied
from tests.patches.test_sm120_symm_mem_sizes import table_name
from tests.support import proofs, wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

SIZES = f"{wheels.COMMUNICATORS}/all_reduce_utils.py"
COMMUNICATOR = f"{wheels.COMMUNICATORS}/torch_symm_mem.py"
MiB = proofs.MiB

pytestmark = pytest.mark.wheel


def communicator(release: Version) -> tuple[str, str]:
    if release >= Version("0.5.4.post3"):
        return COMMUNICATOR, "TorchSymmMemCommunicator"
    return f"{wheels.COMMUNICATORS}/symm_mem.py", "SymmMemCommunicator"


def matrix_expected(release: Version) -> str:
    return "applied" if release < Version("0.5.14") else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 dies with `KeyError: 12`."""
    path, name = communicator(release)
    with pytest.raises(KeyError, match="12"):
        proofs.communicator_run(pristine[path], pristine[SIZES], name, 12, 8)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Capability 12 all-reduces with two-shot and capability 10's size; 10 keeps multimem."""
    path, name = communicator(release)
    sizes = proofs.size_table(patched[SIZES], table_name(release))
    run = proofs.communicator_run(patched[path], patched[SIZES], name, 12, 8)
    assert run.enabled and run.kernel == "two_shot" and run.max_size == sizes[10][8]
    assert proofs.communicator_run(patched[path], patched[SIZES], name, 10, 8).kernel == "multimem"


def _communicator_and_sizes(release: str) -> tuple[bytes, bytes]:
    version = Version(release)
    sizes, _ = engine.transform_source(
        wheels.member(release, SIZES), SIZES, [Sm120SymmMemSizes()], version
    )
    communicator, outcomes = engine.transform_source(
        wheels.member(release, COMMUNICATOR), COMMUNICATOR, [Sm120SymmMemTwoShot()], version
    )
    assert sizes is not None
    if communicator is None:
        assert isinstance(outcomes["sm120-symm-mem-two-shot"], AlreadyApplied)
        return wheels.member(release, COMMUNICATOR), sizes.after
    assert isinstance(outcomes["sm120-symm-mem-two-shot"], Applied)
    return communicator.after, sizes.after


@pytest.mark.parametrize("world_size", [2, 4, 6, 8])
def test_capability_12_all_reduces_with_the_two_shot_kernel(world_size: int) -> None:
    communicator, sizes = _communicator_and_sizes(SEED)
    run = proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 12, world_size)
    assert run.enabled
    assert run.max_size == (64 if world_size <= 4 else 128) * MiB
    assert run.kernel == "two_shot"


def test_other_capabilities_keep_their_kernels() -> None:
    communicator, sizes = _communicator_and_sizes(SEED)
    assert (
        proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 10, 8).kernel
        == "multimem"
    )
    assert (
        proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 10, 4).kernel
        == "two_shot"
    )
    assert (
        proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 9, 4).kernel
        == "multimem"
    )


def test_from_0_5_12_upstream_already_routes_unknown_capabilities_to_two_shot() -> None:
    communicator, sizes = _communicator_and_sizes("0.5.14")
    assert communicator == wheels.member("0.5.14", COMMUNICATOR)  # untouched
    run = proofs.communicator_run(communicator, sizes, "TorchSymmMemCommunicator", 12, 8)
    assert run.enabled and run.kernel == "two_shot"


# Capability-12 parts have no NVLink, so no multicast: the rendezvous returns multicast_ptr 0.


def test_without_multicast_unpatched_0_5_9_dies_with_keyerror_12() -> None:
    sizes = wheels.member(SEED, SIZES)
    communicator = wheels.member(SEED, COMMUNICATOR)
    with pytest.raises(KeyError) as raised:
        proofs.communicator_run(
            communicator, sizes, "TorchSymmMemCommunicator", 12, 8, multicast=False
        )
    assert raised.value.args == (12,)


def test_without_multicast_patched_0_5_9_builds_the_communicator_then_disables_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    communicator, sizes = _communicator_and_sizes(SEED)
    with caplog.at_level("WARNING"):
        run = proofs.communicator_run(
            communicator, sizes, "TorchSymmMemCommunicator", 12, 8, multicast=False
        )
    assert run.rendezvous  # the buffer was allocated and exchanged: no KeyError on the way
    assert not run.enabled and run.kernel is None
    assert run.max_size == 128 * MiB
    assert "multicast operations are not supported" in caplog.text


def test_with_multicast_patched_0_5_9_is_enabled_and_uses_two_shot() -> None:
    communicator, sizes = _communicator_and_sizes(SEED)
    run = proofs.communicator_run(
        communicator, sizes, "TorchSymmMemCommunicator", 12, 8, multicast=True
    )
    assert run.rendezvous and run.enabled and run.kernel == "two_shot"


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
