"""sm120-inkling-grouped-gemm-stages: three stages for Inkling's small-M grouped GEMM on 12.

Two levels. The release's own `grouped_gemm_triton` (cut out of the wheel, run with its own
`is_sm121` / `is_sm120_supported` from common.py on a stand-in device, the kernel launch recorded)
says which config each capability gets. The release's own `@triton.jit` `_grouped_gemm_kernel` is
then cross-compiled for sm_120 with exactly that config at Inkling-Small's shapes (hidden 4096,
expert intermediate 2048, 256 experts: the shapes of PR #33108's GB10 sweep), and Triton's
`metadata.shared` is compared with the 101376 bytes of a capability-12 block.

No release fixes 12.0, so the differential proof compares the patched 12.0 with the choice
upstream made for 12.1, the part with the same 101376 bytes (0.5.18's own `is_sm121()` branch).
"""

from __future__ import annotations

import ast
import importlib.util
import math
import tempfile
import types
from collections.abc import Mapping
from contextlib import nullcontext
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_inkling_grouped_gemm_stages import Sm120InklingGroupedGemmStages
from tests.support import stand_ins_moe as stand_ins
from tests.support import stand_ins_triton as triton_run
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import NEWEST

pytestmark = pytest.mark.wheel

PATCH = Sm120InklingGroupedGemmStages()
FIRST, GATED = "0.5.16", "0.5.18"  # Inkling arrives; upstream's is_sm121() gate
RELEASES = stand_ins.releases(FIRST, NEWEST)
LIMIT = triton_run.SM120_SHARED_MEMORY
SMALL_M, LARGE_M = 16, 128  # select_grouped_gemm_block_m: <= 6144 routed tokens, else 128
# Inkling-Small: hidden 4096, expert intermediate 2048 (gate+up: 4096 rows), 256 experts.
HIDDEN, INTERMEDIATE, EXPERTS = 4096, 2048, 256
GEMMS = {"gate_up": (HIDDEN, 2 * INTERMEDIATE), "down": (INTERMEDIATE, HIDDEN)}  # (K, N)
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "i32": 4}


def path(release: Version) -> str:
    target = PATCH.target_file(release)
    assert target is not None
    return f"sglang/{target}"


@cache
def pristine(release: str) -> bytes:
    return wheels.member(release, path(Version(release)))


class Tensor(triton_run.FakeTensor):
    """What `grouped_gemm_triton` reads from its tensors besides shape, dtype and strides."""

    device = "cuda"

    def is_contiguous(self) -> bool:
        return True

    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel() * ITEMSIZE[self.dtype]


def _stand_in_torch() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        empty=lambda shape, device=None, dtype="bf16": Tensor(*shape, dtype=dtype),
        float32="fp32",
        profiler=types.SimpleNamespace(record_function=lambda name: nullcontext()),
    )


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []

    def __getitem__(self, grid: object) -> Any:
        return lambda *args, **kwargs: self.launches.append(kwargs)


def launch(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    block_m: int = SMALL_M,
    gemm: str = "gate_up",
    dtype: str = "bf16",
) -> dict[str, Any]:
    """The keyword arguments the release's own `grouped_gemm_triton` launches its kernel with,
    on a CUDA device of `capability` (its predicates are the release's own, from common.py)."""
    recorder = _Recorder()
    names = {
        **stand_ins.host_names(release, capability),
        "torch": _stand_in_torch(),
        "triton": types.SimpleNamespace(cdiv=lambda a, b: -(-a // b)),
        "_grouped_gemm_kernel": recorder,
    }
    function = stand_ins.load_function(source, "grouped_gemm_triton", names)
    k, n = GEMMS[gemm]
    tokens = 1024 * 6  # 1024 tokens, top 6
    a, b = Tensor(tokens, k, dtype=dtype), Tensor(EXPERTS, n, k, dtype=dtype)
    index = [Tensor(EXPERTS, dtype="i32"), Tensor(EXPERTS + 1, dtype="i32")]
    schedule = Tensor(tokens // block_m + EXPERTS, dtype="i32")
    function(a, b, EXPERTS, index[0], index[1], index[1], schedule, block_size_m=block_m)
    (kwargs,) = recorder.launches
    return kwargs


CONFIG = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def config(source: bytes, release: str, capability: tuple[int, int], **kw: Any) -> tuple[int, ...]:
    kwargs = launch(source, release, capability, **kw)
    return tuple(kwargs[name] for name in CONFIG)


@cache
def kernel(source: bytes) -> Any:
    """The release's own `_grouped_gemm_kernel` (and the jit helper it calls), loaded from a real
    file with real Triton: the rest of the module (helion, torch, SGLang) is not imported."""
    text = source.decode()
    tree = syntax.tree(source)
    wanted = {"_compute_expert_attrs", "_grouped_gemm_kernel"}
    lines = text.splitlines(keepends=True)
    parts = ["import triton\nimport triton.language as tl\n\n"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            parts.append("".join(lines[start - 1 : node.end_lineno]) + "\n\n")
    assert len(parts) == 1 + len(wanted)
    folder = Path(tempfile.mkdtemp(prefix="sglpatch-inkling-"))
    file = folder / "grouped_gemm.py"
    file.write_text("".join(parts))
    spec = importlib.util.spec_from_file_location(f"_inkling_{abs(hash(source))}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._grouped_gemm_kernel


def shared(source: bytes, release: str, capability: tuple[int, int], **kw: Any) -> int:
    """Shared memory of the release's kernel compiled for sm_120 as it launches on `capability`."""
    kwargs = launch(source, release, capability, **kw)
    call = triton_run.Launch((), kwargs)
    return triton_run.shared_memory(kernel(source), call, aligned=True).shared


def matrix_expected(release: Version) -> str:
    return "not for this release" if release < Version(FIRST) else "applied"


def matrix_symptom(release: Version, pristine_files: Mapping[str, bytes]) -> None:
    """Unpatched, 12.0 (and 12.1 before 0.5.18) decodes with four stages."""
    source = pristine_files[path(release)]
    name = str(release)
    assert config(source, name, (12, 0))[-1] == 4
    assert config(source, name, (12, 1))[-1] == (3 if release >= Version(GATED) else 4)


def matrix_effect(release: Version, patched_files: Mapping[str, bytes]) -> None:
    """12.0 and 12.1 decode with three stages, the rest of the config as before; every other
    capability, and the prefill branch everywhere, exactly as before."""
    source = patched_files[path(release)]
    name = str(release)
    before = pristine(name)
    for capability in stand_ins.SM120:
        got = config(source, name, capability)
        assert got[-1] == 3 and got[:-1] == config(before, name, capability)[:-1]
        assert config(source, name, capability, block_m=LARGE_M) == config(
            before, name, capability, block_m=LARGE_M
        )
    for capability in stand_ins.OTHERS:
        for block_m in (SMALL_M, LARGE_M):
            assert config(source, name, capability, block_m=block_m) == config(
                before, name, capability, block_m=block_m
            ), (capability, block_m)


@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_decodes_with_three_stages(release: str) -> None:
    version = Version(release)
    matrix_symptom(version, {path(version): pristine(release)})
    matrix_effect(version, {path(version): wheels.patched(release, patch=PATCH)})


@pytest.mark.parametrize("release", [FIRST, GATED, NEWEST])
@pytest.mark.parametrize("gemm", GEMMS)
def test_the_small_m_kernel_fits_12_0_only_when_patched(release: str, gemm: str) -> None:
    """The release's own kernel, compiled for sm_120 at the config 12.0 gets."""
    before = shared(pristine(release), release, (12, 0), gemm=gemm)
    after = shared(wheels.patched(release, patch=PATCH), release, (12, 0), gemm=gemm)
    assert before == 110592 > LIMIT  # the figure in PR #37803's crash
    assert after == 73728 <= LIMIT


@pytest.mark.parametrize("release", [GATED, NEWEST])
def test_12_0_gets_what_upstream_gives_12_1(release: str) -> None:
    """Upstream's own answer for the part with the same 101376 bytes: 0.5.18's is_sm121() branch."""
    upstream_12_1 = config(pristine(release), release, (12, 1))
    assert upstream_12_1[-1] == 3
    assert config(wheels.patched(release, patch=PATCH), release, (12, 0)) == upstream_12_1
    assert config(wheels.patched(release, patch=PATCH), release, (12, 1)) == upstream_12_1
    assert shared(wheels.patched(release, patch=PATCH), release, (12, 0)) == shared(
        pristine(release), release, (12, 1)
    )


def test_12_1_before_0_5_18_gets_0_5_18s_config() -> None:
    """0.5.16/0.5.17 gave GB10 four stages too; patched it gets what 0.5.18 gives it."""
    assert config(pristine(FIRST), FIRST, (12, 1))[-1] == 4
    assert config(wheels.patched(FIRST, patch=PATCH), FIRST, (12, 1)) == config(
        pristine(GATED), GATED, (12, 1)
    )


@pytest.mark.parametrize("release", [FIRST, NEWEST])
def test_the_prefill_branch_fits_without_a_gate(release: str) -> None:
    """`BLOCK_SIZE_M=128` keeps its three stages on 12: 98304 bytes, as upstream's comment says."""
    assert (
        shared(wheels.patched(release, patch=PATCH), release, (12, 0), block_m=LARGE_M)
        == 98304
        <= LIMIT
    )


@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
def test_other_capabilities_keep_four_stages(capability: tuple[int, int]) -> None:
    for release in (FIRST, GATED):
        assert config(wheels.patched(release, patch=PATCH), release, capability)[-1] == 4


HELION = "sglang/srt/layers/moe/moe_runner/triton_utils"


@pytest.mark.parametrize("release", [FIRST, "0.5.17"])
def test_before_0_5_18_the_next_step_is_helions_missing_sm12x_config(release: str) -> None:
    """What the patch does not fix on 0.5.16/0.5.17: the activation between the two grouped
    GEMMs is a helion kernel whose AOT configs are read from `<name>_sm_<major><minor>.json`
    (HELION_AOT_AUTOTUNE=none by default: a missing file raises "Helion kernel not tuned yet").
    The wheels ship sm_90, sm_95 and sm_100 files only; 0.5.18 replaced helion with Triton."""
    helper = wheels.member(release, f"{HELION}/helion_utils.py").decode()
    assert 'gpu_arch = f"sm_{cc_major}{cc_minor}"' in helper
    assert "Helion kernel not tuned yet" in helper
    configs = [m for m in wheels.members(release, f"{HELION}/configs/") if "silu_and_mul" in m]
    arches = {m.rsplit("_sm_", 1)[1].removesuffix(".json") for m in configs}
    assert arches == {"90", "95", "100"}  # no 120, no 121
    assert b"import helion" in pristine(release)
    assert b"import helion" not in pristine(GATED)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
