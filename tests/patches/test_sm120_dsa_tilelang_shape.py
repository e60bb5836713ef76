"""TileLang's bf16 DSA kernel on capability 12: the patched dispatcher builds a shape that fits.

The dispatcher (`tilelang_sparse_fwd`) and the helper the patch adds are the release's own code,
run on a stand-in `torch.cuda` and small pure-Python arrays, with stand-in kernel factories that
record what they are asked to build and compute sparse attention in plain Python. Above 32 query
heads capability 12 runs the kernel 32 heads at a time; the test proves the output equals the
same computation over all heads at once (every head attends to the one shared KV on its own).

The shared memory of each shape is what TileLang allocates (`dyn_shared_memory_buf`) lowering the
release's own kernel for sm_120 on a CPU machine (0.1.12; 0.1.8, the pin of 0.5.12 - 0.5.14, for
the v2 kernel of 0.5.9 - 0.5.14, whose `T.gemm(..., wg_wait=-1)` 0.1.12 no longer takes);
`test_the_shapes_lower_to_these_figures` re-measures it where that tilelang is installed, and
`test_a_launch_compiles_for_sm_120_without_spilling` compiles the launch capability 12 now makes
with the CUDA compiler (nvidia-cuda-nvcc) for sm_120, from either TileLang's lowering.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patch import ByRelease
from sglpatch.patches.sm120_dsa_tilelang_shape import (
    HEADS_PER_LAUNCH,
    SHAPE,
    V1,
    Sm120DsaTilelangShape,
)
from sglpatch.results import Failed
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks
from tests.support.stand_ins_tilelang import (
    D_V,
    TAIL,
    V2,
    cat,
    inputs,
    kernel_path,
    run,
    sparse_attention,
)

pytestmark = pytest.mark.wheel

PATCH = Sm120DsaTilelangShape()
FIRST = Version("0.5.9")
SMEM_12 = 101376
SMALL = tuple(sorted(SHAPE.items()))
# (kernel, shape, heads per launch, RoPE tail) -> bytes, TileLang 0.1.12, sm_120, 0.5.22. The
# kernels pad the heads to a power of two of at least 16 and take them in blocks of 64 at most:
# 128 heads need what 64 do, per block.
LOWERED = {
    (V1, (), 16, 0): 151552,
    (V1, (), 32, 0): 169984,  # "Failed to set ... dynamic shared memory size to 169984"
    (V1, (), 64, 0): 206848,
    ("sparse_attention_fwd_kernel_v2", (), 16, 64): 170048,
    ("sparse_attention_fwd_kernel_v2", (), 32, 64): 190592,
    ("sparse_attention_fwd_kernel_v2", (), 64, 64): 231680,
    (V1, SMALL, 16, 0): 51200,
    (V1, SMALL, 32, 0): 68608,
    (V1, SMALL, 64, 0): 103424,
    (V1, SMALL, 128, 0): 103424,
    (V1, SMALL, 16, 64): 57344,
    (V1, SMALL, 32, 64): 76800,
    (V1, SMALL, 64, 64): 115712,
    (V1, SMALL, 128, 64): 115712,
}
# The same, TileLang 0.1.12, 0.5.15: v1 is one kernel from 0.5.4.post2 to 0.5.19 (0.5.20 lets it
# drop the RoPE tail), v2 one from 0.5.15 to 0.5.23.
LOWERED_0_5_15 = {
    (V1, (), 16, 64): 169984,
    (V1, (), 32, 64): 190464,
    (V1, (), 64, 64): 231424,
    (V2, (), 16, 64): 170048,
    (V2, (), 32, 64): 190592,
    (V2, (), 64, 64): 231680,
    (V1, SMALL, 16, 64): 57344,
    (V1, SMALL, 32, 64): 76800,
    (V1, SMALL, 64, 64): 115712,
    (V1, SMALL, 128, 64): 115712,
}
# The v2 of 0.5.9 - 0.5.14 and the v1 they share, TileLang 0.1.8 (the pin of 0.5.12 - 0.5.14;
# 0.5.9 - 0.5.11 pin none), 0.5.12.
LOWERED_0_5_12 = {
    (V2, (), 16, 64): 170048,
    (V2, (), 32, 64): 190592,
    (V2, (), 64, 64): 231680,
    (V1, SMALL, 16, 64): 57344,
    (V1, SMALL, 32, 64): 76800,
    (V1, SMALL, 64, 64): 115712,
    (V1, SMALL, 128, 64): 115712,
}
Figures = dict[tuple[str, tuple[tuple[str, int], ...], int, int], int]


class Lowering(NamedTuple):
    """Figures lowered from one release's tilelang_kernel.py by one TileLang."""

    release: str
    tilelang: str
    figures: Figures


LOWERINGS = (
    Lowering("0.5.22", "0.1.12", LOWERED),
    Lowering("0.5.15", "0.1.12", LOWERED_0_5_15),
    Lowering("0.5.12", "0.1.8", LOWERED_0_5_12),
)
# The figures that hold for each release's kernels.
FIGURES = ByRelease(
    {">=0.5.20": LOWERED, ">=0.5.15,<0.5.20": LOWERED_0_5_15, ">=0.5.9,<0.5.15": LOWERED_0_5_12}
)


def _figures(release: Version) -> Figures:
    figures = FIGURES.get(release)
    assert figures is not None
    return figures


# Query heads per attention rank: GLM-5.3-Flash (64 heads) at TP 8, 4, 2, 1; DeepSeek-V3.2 and
# GLM-5 (128) at TP 8, 4, 2, 1; and one that is no multiple of 32.
HEADS = [8, 16, 32, 48, 64, 128]


def _padded(heads: int) -> int:
    return min(max(16, 1 << (heads - 1).bit_length()), 64)


def _bytes(release: Version, kernel: str, shape: Any, heads: int, tail: int) -> int:
    return _figures(release)[kernel, shape, _padded(heads), 64 if tail else 0]


def matrix_expected(release: Version) -> str:
    return "applied" if release >= FIRST else "not for this release"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 builds the default shape, which needs over 101376 B."""
    source = pristine[kernel_path(str(release))]
    for capability in stand_ins.SM120:
        ((kernel, shape, heads),) = run(source, capability, 32, TAIL).builds
        assert _bytes(release, kernel, shape, heads, TAIL) > SMEM_12


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On 12 every launch is v1 in the small shape with at most 32 heads, and fits; the output is
    the kernel's over all heads at once. Other capabilities build and get what they did."""
    source = patched[kernel_path(str(release))]
    pristine = wheels.member(str(release), kernel_path(str(release)))
    tails = [0, TAIL] if release >= Version("0.5.20") else [TAIL]
    for tail in tails:
        for heads in HEADS:
            whole = sparse_attention(heads, 0.1)(*(a.unsqueeze(0) for a in inputs(heads, tail)))
            for capability in stand_ins.SM120:
                got = run(source, capability, heads, tail)
                assert [b[:2] for b in got.builds] == [(V1, SMALL)] * len(got.builds)
                launches = [b[2] for b in got.builds]
                assert sum(launches) == heads and max(launches) <= HEADS_PER_LAUNCH
                assert all(_bytes(release, V1, SMALL, h, tail) <= SMEM_12 for h in launches)
                assert got.out.shape == (1, 2, heads, D_V)
                assert got.out.data == whole.data
            for capability in stand_ins.OTHERS:
                assert run(source, capability, heads, tail) == run(
                    pristine, capability, heads, tail
                )


@pytest.mark.parametrize(
    "release",
    [
        "0.5.9",
        "0.5.10",
        "0.5.12",
        "0.5.13",
        "0.5.14",
        "0.5.15",
        "0.5.16",
        "0.5.20",
        "0.5.22",
        "0.5.23",
    ],
)
def test_capability_12_builds_a_kernel_that_fits(release: str) -> None:
    matrix_effect(Version(release), {kernel_path(release): wheels.patched(release, patch=PATCH)})


@pytest.mark.parametrize("release", ["0.5.9", "0.5.12", "0.5.14", "0.5.15", "0.5.16", "0.5.22"])
def test_unpatched_capability_12_asks_for_more_than_it_has(release: str) -> None:
    matrix_symptom(
        Version(release), {kernel_path(release): wheels.member(release, kernel_path(release))}
    )


@pytest.mark.parametrize("heads", [64, 128])
def test_more_than_32_heads_in_one_launch_would_not_fit(heads: int) -> None:
    # Why capability 12 launches 32 heads at a time: above 32 the kernel takes a block of 64.
    for figures in (LOWERED, LOWERED_0_5_15, LOWERED_0_5_12):
        assert figures[V1, SMALL, heads, 64] > SMEM_12
    assert LOWERED[V1, SMALL, heads, 0] > SMEM_12


def test_the_split_is_what_makes_the_output_right() -> None:
    # The equality in matrix_effect can fail: a helper that slices the wrong axis or joins the
    # launches out of order gives another output.
    q, kv, indices = (a.unsqueeze(0) for a in inputs(64, TAIL))
    whole = sparse_attention(64, 0.1)(q, kv, indices)
    halves = [sparse_attention(32, 0.1)(q[:, :, h : h + 32], kv, indices) for h in (32, 0)]
    assert cat(halves, 2).shape == whole.shape and cat(halves, 2).data != whole.data
    assert cat(halves[::-1], 2).data == whole.data


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "min(h + 32, num_heads)) for h in range(0, num_heads, 32)",
            "min(h + 64, num_heads)) for h in range(0, num_heads, 64)",
        ),
        ("block_I=32, num_stages=1", "block_I=64, num_stages=1"),
    ],
)
def test_a_changed_helper_is_not_taken_as_applied(old: str, new: str) -> None:
    # The postcondition reads the helper: 64 heads a launch, or another shape, would not fit.
    path = kernel_path("0.5.22")
    changed = wheels.patched("0.5.22", patch=PATCH).replace(old.encode(), new.encode())
    assert changed != wheels.patched("0.5.22", patch=PATCH)
    patch = Sm120DsaTilelangShape()
    change, outcomes = engine.transform_source(
        changed, path, [patch], Version("0.5.22"), [patch.id]
    )
    assert change is None and isinstance(outcomes[patch.id], Failed)


def _load_kernels(tmp_path: Any, release: str) -> Any:
    """The release's tilelang_kernel.py, imported with stand-ins for the SGLang helpers it reads."""
    import importlib.util
    import sys
    from unittest import mock

    path = tmp_path / "tilelang_kernel.py"
    path.write_bytes(wheels.member(release, kernel_path(release)))
    helpers = {
        "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        "sglang.srt.layers.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
    }
    modules = {}
    for name, attrs in helpers.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        modules[name] = module
    with mock.patch.dict(sys.modules, modules):
        spec = importlib.util.spec_from_file_location("tilelang_kernel", path)
        assert spec is not None and spec.loader is not None
        kernels = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernels)
    return kernels


def _lowered(tilelang: Any, kernels: Any, kernel: str, heads: int, tail: int, shape: Any) -> Any:
    from tvm.target import Target

    target = Target(
        {"kind": "cuda", "arch": "sm_120", "max_shared_memory_per_block": SMEM_12}, host="llvm"
    )
    tir = getattr(kernels, kernel).get_tir(heads, 512, tail, 2048, **dict(shape))
    with target:
        return tilelang.lower(tir, target=target)


def _shared_memory(lowered: Any) -> list[int]:
    return [
        int(str(f.attrs["dyn_shared_memory_buf"]))
        for f in lowered.device_mod.functions.values()
        if f.attrs and "dyn_shared_memory_buf" in f.attrs
    ]


@pytest.mark.parametrize("lowering", LOWERINGS, ids=lambda lowering: lowering.release)
def test_the_shapes_lower_to_these_figures(tmp_path: Any, lowering: Lowering) -> None:
    tilelang = pytest.importorskip("tilelang")  # with torch and nvidia-cuda-nvcc
    if tilelang.__version__.split("+")[0] != lowering.tilelang:
        pytest.skip(f"lowered by TileLang {lowering.tilelang}, not {tilelang.__version__}")
    kernels = _load_kernels(tmp_path, lowering.release)
    for (kernel, shape, heads, tail), expected in lowering.figures.items():
        lowered = _lowered(tilelang, kernels, kernel, heads, tail, shape)
        assert _shared_memory(lowered) == [expected], (kernel, shape, heads, tail)


@pytest.mark.parametrize(
    ("release", "tilelang_version", "tail"),
    [
        ("0.5.22", "0.1.12", 0),
        ("0.5.22", "0.1.12", 64),
        ("0.5.15", "0.1.12", 64),
        ("0.5.12", "0.1.8", 64),
    ],
)
def test_a_launch_compiles_for_sm_120_without_spilling(
    tmp_path: Any, release: str, tilelang_version: str, tail: int
) -> None:
    # The launch capability 12 makes at 32 heads (and so for 64 and 128, two and four of them):
    # the CUDA compiler takes it for sm_120, keeps it in registers (255 at most) and its dynamic
    # and static shared memory together within 101376 B; one launch of 64 heads in the same
    # shape would spill 1.5-2.3 kB per thread.
    tilelang = pytest.importorskip("tilelang")  # with torch and nvidia-cuda-nvcc
    if tilelang.__version__.split("+")[0] != tilelang_version:
        pytest.skip(f"compiled with TileLang {tilelang_version}, not {tilelang.__version__}")
    import re
    import subprocess

    from tilelang.contrib import nvcc
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    kernels = _load_kernels(tmp_path, release)
    lowered = _lowered(tilelang, kernels, V1, HEADS_PER_LAUNCH, tail, SMALL)
    (dynamic,) = _shared_memory(lowered)
    assert dynamic == _figures(Version(release))[V1, SMALL, HEADS_PER_LAUNCH, tail]
    source = tmp_path / "kernel.cu"
    source.write_text(lowered.kernel_source)
    command = [
        *(nvcc.get_nvcc_compiler(), "--cubin", "-O3", "-arch=sm_120", "-std=c++20", "-w"),
        *(f"-I{TILELANG_TEMPLATE_PATH}", f"-I{CUTLASS_INCLUDE_DIR}", "--ptxas-options=-v"),
        *("-o", str(tmp_path / "kernel.cubin"), str(source)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    report = done.stdout + done.stderr
    assert done.returncode == 0 and "for 'sm_120'" in report, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    static = sum(int(n) for n in re.findall(r"(\d+) bytes smem", report))
    assert dynamic + static <= SMEM_12, report


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
