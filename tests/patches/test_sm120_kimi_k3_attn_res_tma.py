"""sm120-kimi-k3-attn-res-tma, proven against upstream's own gate (0.5.19) on the real wheels.

`_use_fast` (and, from 0.5.19, `_supports_attn_res_tma`) is cut out of the release's (patched)
attn_residual.py and run with a stand-in `torch.cuda` of the given capability. Nothing imports
torch; the kernel's own refusal is read from the wheel's kimi_k3/attn_res.py.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_kimi_k3_attn_res_tma import (
    FIXED,
    GATE,
    UPSTREAM,
    Sm120KimiK3AttnResTma,
)
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120KimiK3AttnResTma()
PATH = "sglang/srt/layers/attn_residual.py"
KERNEL = "sglang/kernels/ops/kimi_k3/attn_res.py"
APPLIED = ["0.5.17", "0.5.18"]
SM120 = [(12, 0), (12, 1)]
OTHERS = [(8, 9), (9, 0), (10, 0), (10, 3)]
HIDDEN = 7168  # Kimi-K3's hidden size, the kernel's one instantiation


def use_fast(source: bytes, capability: tuple[int, int], hidden_size: int = HIDDEN) -> bool:
    """The release's `_use_fast(hidden_size)` on a CUDA GPU of `capability`."""
    tree = ast.parse(source)
    wanted = {GATE, UPSTREAM}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_device_capability=lambda device=None: capability)
    )
    names = {
        "torch": torch,
        "_FAST_SUPPORTED": None,
        "is_npu": lambda: False,
        "is_hip": lambda: False,
        "is_cuda": lambda: True,
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), PATH, "exec"), names)
    result = names[GATE](hidden_size)
    assert isinstance(result, bool)
    return result


@pytest.mark.parametrize("capability", SM120, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_unpatched_release_sends_capability_12_to_the_tma_kernel(
    release: str, capability: tuple[int, int]
) -> None:
    assert use_fast(wheels.member(release, PATH), capability) is True
    # ...whose source is built on tcgen05 and setmaxnreg, and whose own guard lets 12 through.
    kernel = wheels.member(release, KERNEL).decode()
    assert "if major < 10:" in kernel and "tcgen05" in kernel


@pytest.mark.parametrize("capability", SM120, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_takes_triton_like_the_fixing_release(
    release: str, capability: tuple[int, int]
) -> None:
    ours = use_fast(wheels.patched(release, patch=PATCH), capability)
    assert ours == use_fast(wheels.member(str(FIXED), PATH), capability) is False


@pytest.mark.parametrize("capability", OTHERS, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_other_capabilities_keep_their_answer(release: str, capability: tuple[int, int]) -> None:
    ours = use_fast(wheels.patched(release, patch=PATCH), capability)
    assert ours == use_fast(wheels.member(release, PATH), capability)
    assert ours == use_fast(wheels.member(str(FIXED), PATH), capability)
    assert ours is (capability[0] == 10)


def test_other_hidden_sizes_never_took_the_kernel() -> None:
    assert use_fast(wheels.patched("0.5.18", patch=PATCH), (10, 0), hidden_size=4096) is False


def test_the_fixing_release_also_makes_the_kernel_refuse_12() -> None:
    assert "major < 10 or major == 12" in wheels.member(str(FIXED), KERNEL).decode()


def test_0_5_19_is_left_alone() -> None:
    wheels.assert_left_alone(PATCH, str(FIXED))


def test_before_0_5_17_there_is_no_kimi_k3() -> None:
    assert PATCH.target_file(Version("0.5.16")) is None
    assert "sglang/srt/models/kimi_k3.py" not in wheels.members("0.5.16")


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release < Version("0.5.17"):
        return "not for this release"
    return "applied" if release < FIXED else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Capability 12.0 and 12.1 stay off the TMA kernel; 10.0 keeps it."""
    if matrix_expected(release) == "not for this release":
        return
    source = patched.get(PATH, wheels.member(str(release), PATH))
    for capability, fast in [((12, 0), False), ((12, 1), False), ((10, 0), True)]:
        if use_fast(source, capability) is not fast:
            raise AssertionError(f"{release}: Kimi-K3 attention-residual fast path at {capability}")


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 takes the TMA kernel."""
    if not use_fast(pristine.get(PATH, wheels.member(str(release), PATH)), (12, 0)):
        raise AssertionError(f"{release}: capability 12 does not take the TMA kernel")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
