"""The shim's torch code computes what 0.5.22's own torch path computes, on the inputs the call
sites of 0.5.9 - 0.5.21 pass (needs torch: skipped without it, as in CI).

Ours is the class as `sm120-dsa-indexer-torch-logits` inserts it (compiled from a patched 0.5.21
indexer); 0.5.22's are `_fp8_mqa_logits_torch` and `_fp8_paged_mqa_logits_torch` of its
`dsa/utils.py`, with the DSv4 indexer's `fp8_paged_mqa_logits_torch` the latter imports, all
compiled from the 0.5.22 wheel. Inputs are random FP8 in DeepGEMM's layouts: 32 and 64 heads of
128, 64-token blocks, contexts 1 - 1000, next_n 1 and 2 (0.5.22 takes one query row per sequence:
next_n 2 is compared with its rows laid out one per sequence, as capability 12 reaches it).

Equal means: 0 at exactly the same places (every key a row does not see; `clean_logits=False`,
as every call site passes), and elsewhere within 2^-7 of the sum of the terms' magnitudes
(sum over heads of |weight * q.k| * scale). 0.5.22 rounds each head's scores to bfloat16 (unit
roundoff 2^-8); ours keeps float32, and is checked within 1e-5 of that sum against a float64
reference of DeepGEMM's definition as well, and with DeepGEMM's own similarity measure
(`calc_diff` < 1e-3, as its tests require). Measured over these 14 cases (torch 2.13 CPU,
2026-12-04): ours within 1.8e-7 of the reference, 0.5.22 within 1.8e-3, ours against 0.5.22
within 1.8e-3 (relative to that sum); `calc_diff` of ours against 0.5.22 at most 2.1e-6.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from typing import Any
from unittest import mock

import pytest

from sglpatch.patches.sm120_dsa_indexer_torch_logits import (
    SHIM,
    Sm120DsaIndexerTorchLogits,
)
from tests.support import syntax, wheels

pytestmark = pytest.mark.wheel

UPSTREAM = "0.5.22"
DSV4 = "sglang.srt.layers.attention.dsv4.indexer"
BLOCK, DIM = 64, 128
OURS_TOLERANCE, THEIRS_TOLERANCE = 1e-5, 2.0**-7


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


def _functions(source: bytes, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    body = [
        n for n in syntax.tree(source).body if isinstance(n, ast.FunctionDef) and n.name in names
    ]
    assert {n.name for n in body} == names
    exec(compile(ast.Module(body=body, type_ignores=[]), "upstream", "exec"), namespace)
    return namespace


@functools.cache
def _ours(torch: Any) -> Any:
    source = wheels.patched("0.5.21", patch=Sm120DsaIndexerTorchLogits())
    classes = [n for n in syntax.tree(source).body if isinstance(n, ast.ClassDef)]
    namespace: dict[str, Any] = {"torch": torch, "is_cuda": lambda: False}
    body = [n for n in classes if n.name == SHIM]
    exec(compile(ast.Module(body=body, type_ignores=[]), "shim", "exec"), namespace)
    return namespace[SHIM]


@functools.cache
def _theirs(torch: Any) -> tuple[dict[str, Any], dict[str, types.ModuleType]]:
    indexer = wheels.member(UPSTREAM, "sglang/srt/layers/attention/dsv4/indexer.py")
    dsv4: dict[str, Any] = {
        "torch": torch,
        "F": torch.nn.functional,
        "Any": Any,
        "FP8_DTYPE": torch.float8_e4m3fn,  # CUDA's (fnuz is ROCm's)
        "_arange_cache": {},
    }
    _functions(indexer, {"fp8_paged_mqa_logits_torch"}, dsv4)
    modules = {p: types.ModuleType(p) for p in _prefixes(DSV4)}
    modules[DSV4].fp8_paged_mqa_logits_torch = dsv4["fp8_paged_mqa_logits_torch"]  # type: ignore[attr-defined]

    def not_on_cpu(**_: Any) -> Any:
        raise AssertionError("the budget check is for CUDA tensors only")

    utils = wheels.member(UPSTREAM, "sglang/srt/layers/attention/dsa/utils.py")
    names: dict[str, Any] = {
        "torch": torch,
        "mqa_logits_needs_budget_check": not_on_cpu,
        "mqa_logits_static_budget_bytes": not_on_cpu,
    }
    return _functions(utils, {"_fp8_mqa_logits_torch", "_fp8_paged_mqa_logits_torch"}, names), (
        modules
    )


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _fp8_rows(torch: Any, gen: Any, rows: int) -> tuple[Any, Any]:
    """Keys as the index-K cache holds them: per-token FP8 with a float32 scale (amax / 448)."""
    x = torch.randn(rows, DIM, generator=gen)
    scale = x.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (x / scale[:, None]).to(torch.float8_e4m3fn), scale.float()


def _paged_cache(torch: Any, keys: Any, scales: Any) -> Any:
    """DeepGEMM's paged layout: per block, 64 rows of 128 FP8 bytes, then 64 float32 scales."""
    blocks = keys.shape[0] // BLOCK
    cache = torch.empty(blocks, BLOCK * (DIM + 4), dtype=torch.uint8)
    cache[:, : BLOCK * DIM] = keys.view(torch.uint8).reshape(blocks, BLOCK * DIM)
    cache[:, BLOCK * DIM :] = scales.reshape(blocks, BLOCK).view(torch.uint8)
    return cache.view(blocks, BLOCK, 1, DIM + 4)


def _reference(torch: Any, q: Any, keys: Any, scales: Any, w: Any) -> tuple[Any, Any]:
    """DeepGEMM's definition in float64, for rows q [M, H, D] against keys [M, N, D]; and the
    sum of the terms' magnitudes, which bounds rounding."""
    s = torch.einsum("mhd,mnd->mhn", q.double(), keys.double())
    logits = (s.relu() * w.double()[:, :, None]).sum(1) * scales.double()
    bound = (s.abs() * w.double().abs()[:, :, None]).sum(1) * scales.double()
    return logits, bound


def _agree(torch: Any, ours: Any, theirs: Any, ref: Any, bound: Any, valid: Any) -> None:
    assert ours.shape == theirs.shape == valid.shape and ours.dtype == torch.float32
    assert bool((ours[~valid] == 0).all()) and bool((theirs[~valid] == 0).all())
    scale = bound[valid] + 1e-30
    errors = {
        "ours vs reference": ((ours[valid].double() - ref[valid]).abs() / scale).max(),
        "0.5.22 vs reference": ((theirs[valid].double() - ref[valid]).abs() / scale).max(),
        "ours vs 0.5.22": ((ours[valid].double() - theirs[valid].double()).abs() / scale).max(),
    }
    x, y = ours[valid].double(), theirs[valid].double()
    errors["calc_diff"] = 1 - 2 * (x * y).sum() / (x * x + y * y).sum()
    assert errors["ours vs reference"] <= OURS_TOLERANCE
    assert errors["ours vs 0.5.22"] <= THEIRS_TOLERANCE
    assert errors["calc_diff"] < 1e-3


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("lengths", [[(1, 1)], [(100, 300), (200, 700)], [(64, 64), (65, 1000)]])
def test_prefill_logits_equal_0_5_22s(
    torch: Any, heads: int, lengths: list[tuple[int, int]]
) -> None:
    """`fp8_mqa_logits(q, (k, scale), weights, ks, ke, clean_logits=False)` over a batch of
    sequences (new tokens, whole length) laid out one after another, as the indexer's prefill."""
    gen = torch.Generator().manual_seed(heads + len(lengths))
    keys, scales = _fp8_rows(torch, gen, sum(total for _, total in lengths))
    ks, ke, start = [], [], 0
    for new, total in lengths:
        ks += [start] * new
        ke += [start + total - new + i + 1 for i in range(new)]
        start += total
    rows = len(ks)
    q = torch.randn(rows, heads, DIM, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, generator=gen)
    ks_t, ke_t = torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    ours = _ours(torch).torch_fp8_mqa_logits(q, (keys, scales), w, ks_t, ke_t, clean_logits=False)
    theirs = _theirs(torch)[0]["_fp8_mqa_logits_torch"](q, (keys, scales), w, ks_t, ke_t)
    ref, bound = _reference(torch, q, keys.expand(rows, -1, -1), scales, w)
    n = torch.arange(keys.shape[0])
    valid = (n >= ks_t[:, None]) & (n < ke_t[:, None])
    _agree(torch, ours, theirs, ref, bound, valid)
    assert ours.stride(0) % 4 == 0  # the top-k kernels' row stride


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("two_dimensional", [False, True])
def test_decode_logits_equal_0_5_22s(
    torch: Any, heads: int, next_n: int, two_dimensional: bool
) -> None:
    """`fp8_paged_mqa_logits(q, cache, weights, lengths, block_table, schedule, max_len,
    clean_logits=False)` at decode (next_n 1) and target-verify (next_n 2), with lengths [B] or
    [B, next_n] as the indexer passes them."""
    gen = torch.Generator().manual_seed(heads * next_n + two_dimensional)
    contexts = [1, 63, 64, 65, 200, 1000]
    pages = [-(-c // BLOCK) for c in contexts]
    width = max(pages) + 1  # a spare column, as a padded page table has
    keys, scales = _fp8_rows(torch, gen, (sum(pages) + 3) * BLOCK)
    cache = _paged_cache(torch, keys, scales)
    order = torch.randperm(cache.shape[0], generator=gen)
    table = torch.zeros(len(contexts), width, dtype=torch.int32)
    used = 0
    for i, p in enumerate(pages):
        table[i, :p] = order[used : used + p]
        used += p
    batch, max_len = len(contexts), width * BLOCK
    q = torch.randn(batch, next_n, heads, DIM, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, heads, generator=gen)
    context = torch.tensor(contexts, dtype=torch.int32)
    # the keys row (i, j) sees: DeepGEMM's causal rule for [B], or the lengths as given
    seen = (context[:, None] - next_n + 1 + torch.arange(next_n)).reshape(-1).clamp(min=0)
    lengths = seen.reshape(batch, next_n).int() if two_dimensional else context
    schedule = _ours(torch).torch_get_paged_mqa_logits_metadata(lengths, BLOCK, 188)
    assert schedule.shape == (189, 2) and schedule.dtype == torch.int32
    ours = _ours(torch).torch_fp8_paged_mqa_logits(
        q, cache, w, lengths, table, schedule, max_len, clean_logits=False
    )
    functions, modules = _theirs(torch)
    with mock.patch.dict(sys.modules, modules):  # 0.5.22 imports the DSv4 function when called
        theirs = functions["_fp8_paged_mqa_logits_torch"](
            q.reshape(batch * next_n, 1, heads, DIM),
            cache,
            w,
            seen.int().reshape(-1, 1),  # as 0.5.22's indexer passes them: [rows, 1]
            table.repeat_interleave(next_n, dim=0),
            None,
            max_len,
        )
    gathered = keys.view(-1, BLOCK, DIM)[table.long()].reshape(batch, max_len, DIM)
    key_scales = scales.view(-1, BLOCK)[table.long()].reshape(batch, max_len)
    ref, bound = _reference(
        torch,
        q.reshape(batch * next_n, heads, DIM),
        gathered.repeat_interleave(next_n, dim=0),
        key_scales.repeat_interleave(next_n, dim=0),
        w,
    )
    valid = torch.arange(max_len)[None, :] < seen[:, None]
    _agree(torch, ours, theirs, ref, bound, valid)
    assert ours.stride(0) % 256 == 0  # DeepGEMM's padded rows
