"""TileLang's bf16 DSA dispatcher (`tilelang_sparse_fwd`) run on a stand-in device, for
sm120-dsa-tilelang-shape.

The dispatcher and the helper the patch adds are the release's own code, run on a stand-in
`torch.cuda` and small pure-Python arrays (`Array`), with stand-in kernel factories that record
what they are asked to build and compute sparse attention in plain Python (`sparse_attention`).
Nothing imports torch, TileLang or SGLang.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

from packaging.version import Version

from sglpatch.patches.sm120_dsa_tilelang_shape import HELPER, TARGET, V1
from tests.support import stand_ins_moe as stand_ins

V2 = "sparse_attention_fwd_kernel_v2"
# The runs use a small latent (4 + a 2-wide RoPE tail) so that plain Python stays fast; the
# figures are for the models' 512 + 64. A tail_dim of 0 is GLM-5.3-Flash's (0.5.20+: v1).
D_V, TAIL = 4, 2


def kernel_path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


class Array:
    """A bfloat16 CUDA tensor as far as the dispatcher and the helper use one: nested lists."""

    dtype = "bfloat16"
    device = "cuda:0"

    def __init__(self, data: list[Any]) -> None:
        self.data = data

    @property
    def shape(self) -> tuple[int, ...]:
        shape, level = [], self.data
        while isinstance(level, list):
            shape.append(len(level))
            level = level[0]
        return tuple(shape)

    def dim(self) -> int:
        return len(self.shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Array) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def unsqueeze(self, axis: int) -> Array:
        assert axis == 0
        return Array([self.data])

    def contiguous(self) -> Array:
        return self

    def __getitem__(self, key: tuple[slice, ...]) -> Array:
        def take(data: list[Any], key: Sequence[slice]) -> list[Any]:
            return [take(d, key[1:]) if key[1:] else d for d in data[key[0]]]

        return Array(take(self.data, key))


def cat(arrays: Sequence[Array], dim: int) -> Array:
    """`torch.cat` of `Array`s."""

    def join(parts: Sequence[list[Any]], dim: int) -> list[Any]:
        if dim == 0:
            return [row for part in parts for row in part]
        return [join(rows, dim - 1) for rows in zip(*parts, strict=True)]

    return Array(join([a.data for a in arrays], dim))


def sparse_attention(heads: int, sm_scale: float) -> Any:
    """What the TileLang kernels compute, in plain Python: for each token and head, softmax of
    q . kv over the token's selected KV rows (index -1: none), times their first D_V columns."""

    def kernel(q: Array, kv: Array, indices: Array) -> Array:
        batch, tokens, width, dim = q.shape
        rows, group = kv.shape[1:3]
        assert batch == 1 and group == 1 and width == heads and kv.shape[3] == dim
        out = []
        for t in range(tokens):
            chosen = [kv.data[0][i][0] for i in indices.data[0][t][0] if 0 <= i < rows]
            per_head = []
            for h in range(heads):
                query = q.data[0][t][h]
                scores = [
                    sm_scale * sum(a * b for a, b in zip(query, k, strict=True)) for k in chosen
                ]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                per_head.append(
                    [
                        sum(w * k[d] for w, k in zip(weights, chosen, strict=True)) / total
                        for d in range(D_V)
                    ]
                )
            out.append(per_head)
        return Array([out])

    return kernel


class Run(NamedTuple):
    """What the release's `tilelang_sparse_fwd` built and returned for one input."""

    builds: list[tuple[str, tuple[tuple[str, int], ...], int]]  # (kernel, shape, heads)
    out: Array


@cache
def inputs(heads: int, tail: int) -> tuple[Array, Array, Array]:
    """q (2 tokens), kv (16 rows), indices (2048 per token, 3 chosen, the rest -1)."""
    rng = random.Random(heads * 100 + tail)
    dim = D_V + tail
    q = [[[rng.uniform(-1, 1) for _ in range(dim)] for _ in range(heads)] for _ in range(2)]
    kv = [[[rng.uniform(-1, 1) for _ in range(dim)]] for _ in range(16)]
    indices = [[rng.sample(range(16), 3) + [-1] * 2045] for _ in range(2)]
    return Array(q), Array(kv), Array(indices)


def run(source: bytes, capability: tuple[int, int], heads: int, tail: int) -> Run:
    """The release's `tilelang_sparse_fwd` (with the helper the patch adds, where it has one)
    on bf16 q/kv on `capability`."""
    builds: list[tuple[str, tuple[tuple[str, int], ...], int]] = []

    def factory(name: str) -> Any:
        def build(num_heads: int, d_v: int, tail_dim: int, topk: int, **kwargs: Any) -> Any:
            assert (d_v, tail_dim, topk) == (D_V, tail, 2048)
            shape = tuple(sorted((k, v) for k, v in kwargs.items() if k != "sm_scale"))
            builds.append((name, shape, num_heads))
            return sparse_attention(num_heads, kwargs["sm_scale"])

        return build

    torch = stand_ins.stand_in_torch(capability)
    torch.float8_e4m3fn, torch.float8_e4m3fnuz = "float8_e4m3fn", "float8_e4m3fnuz"  # type: ignore[attr-defined]
    torch.cat = cat  # type: ignore[attr-defined]
    names: dict[str, Any] = {
        "torch": torch,
        "_is_hip": False,
        "_is_gfx95_supported": False,
        **{n: factory(n) for n in (V1, V2)},
    }
    if f"def {HELPER}(".encode() in source:
        names[HELPER] = stand_ins.load_function(source, HELPER, names)
    function = stand_ins.load_function(source, "tilelang_sparse_fwd", names)
    out = function(*inputs(heads, tail), 0.1, d_v=D_V)
    return Run(builds, out)
