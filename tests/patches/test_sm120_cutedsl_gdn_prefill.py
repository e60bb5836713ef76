"""sm120-cutedsl-gdn-prefill, proven against upstream's own gate (0.5.23) on the real wheels.

The gate helper is executed from the wheel's (patched) source with a stand-in `torch`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_cutedsl_gdn_prefill import OURS, UPSTREAM, Sm120CutedslGdnPrefill
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120CutedslGdnPrefill()
KERNEL = "sglang/srt/layers/attention/linear/kernels/gdn_cutedsl.py"
FIXED = "0.5.23"
APPLIED = ["0.5.13", "0.5.15.post1", "0.5.18", "0.5.22"]


def gate(source: bytes, name: str) -> Callable[[tuple[int, int]], bool]:
    """The module's helper `name`, run against a stand-in GPU of the given capability."""
    tree = syntax.tree(source)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = compile(ast.Module(body=[function], type_ignores=[]), KERNEL, "exec")

    def run(capability: tuple[int, int]) -> bool:
        torch = mock.MagicMock(name="torch")
        torch.cuda.is_available.return_value = True
        torch.cuda.get_device_capability.return_value = capability
        namespace = {"torch": torch}
        exec(code, namespace)
        result = namespace[name]()
        assert isinstance(result, bool)
        return result

    return run


@pytest.mark.parametrize("release", APPLIED)
def test_the_gate_decides_whether_the_kernel_serves_prefill(release: str) -> None:
    # The helper is what `CuteDSLGDNKernel.supports_prefill` is set from; capability 12 passes it.
    source = wheels.member(release, KERNEL).decode()
    assert f"self.supports_prefill = {OURS}()" in source
    assert gate(wheels.member(release, KERNEL), OURS)((12, 0)) is True


@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_is_kept_off_like_the_fixing_release(
    release: str, capability: tuple[int, int]
) -> None:
    ours = gate(wheels.patched(release, patch=PATCH), OURS)(capability)
    upstream = gate(wheels.member(FIXED, KERNEL), UPSTREAM)(capability)
    assert ours == upstream is False


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (10, 3)])
@pytest.mark.parametrize("release", APPLIED)
def test_other_capabilities_keep_their_answer(release: str, capability: tuple[int, int]) -> None:
    ours = gate(wheels.patched(release, patch=PATCH), OURS)(capability)
    assert ours == gate(wheels.member(release, KERNEL), OURS)(capability)
    assert ours == gate(wheels.member(FIXED, KERNEL), UPSTREAM)(capability)


def test_0_5_23_is_left_alone() -> None:
    wheels.assert_left_alone(PATCH, FIXED)


def test_before_0_5_13_the_kernel_has_no_prefill_to_gate() -> None:
    # 0.5.10-0.5.12.post1 ship a decode-only CuTe DSL GDN kernel: nothing for this patch.
    assert b"supports_prefill" not in wheels.member("0.5.12.post1", KERNEL)
    assert PATCH.target_file(Version("0.5.12.post1")) is None


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release < Version("0.5.13"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On capability 12.0 and 12.1 the CuTe DSL GDN prefill gate says no; on 10.0 yes."""
    if matrix_expected(release) == "not for this release":
        return
    source = patched.get(KERNEL, wheels.member(str(release), KERNEL))
    name = OURS if release < Version(FIXED) else UPSTREAM
    for capability, admitted in [((12, 0), False), ((12, 1), False), ((10, 0), True)]:
        if gate(source, name)(capability) is not admitted:
            raise AssertionError(f"{release}: CuTe DSL GDN prefill gate at {capability}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
