"""Tensors whose cells are labels: enough of torch (slicing, stacking, constants) to run a
weight preparation in pure Python and read which checkpoint row lands where."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any


def _shape(cells: Any) -> tuple[int, ...]:
    shape: list[int] = []
    while isinstance(cells, list):
        shape.append(len(cells))
        cells = cells[0] if cells else None
    return tuple(shape)


def _get(cells: Any, keys: tuple[slice | int, ...]) -> Any:
    if not keys:
        return [_get(c, ()) for c in cells] if isinstance(cells, list) else cells
    key, rest = keys[0], keys[1:]
    if isinstance(key, int):
        return _get(cells[key], rest)
    return [_get(c, rest) for c in cells[key]]


def _set(cells: list[Any], keys: tuple[slice, ...], values: list[Any]) -> None:
    key, rest = keys[0], keys[1:]
    rows = range(*key.indices(len(cells)))
    assert len(rows) == len(values), (len(rows), len(values))
    for row, value in zip(rows, values, strict=True):
        if rest:
            _set(cells[row], rest, value)
        else:
            cells[row] = _get(value, ())


def _filled(shape: tuple[int, ...], value: Any) -> Any:
    if not shape:
        return value
    return [_filled(shape[1:], value) for _ in range(shape[0])]


class Labels:
    """A tensor whose cells are labels: enough of torch for slicing, stacking and constants."""

    def __init__(self, cells: Any, dtype: str = "uint8") -> None:
        self.cells = cells
        self.dtype = dtype
        self.device = "stand-in"

    @property
    def data(self) -> Labels:
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return _shape(self.cells)

    def __getitem__(self, key: Any) -> Labels:
        keys = key if isinstance(key, tuple) else (key,)
        return Labels(_get(self.cells, keys), self.dtype)

    def __setitem__(self, key: Any, value: Labels) -> None:
        keys = key if isinstance(key, tuple) else (key,)
        _set(self.cells, keys, value.cells)

    def reshape_as(self, other: Labels) -> Labels:
        assert other.shape == self.shape
        return self

    def view(self, dtype: Any) -> Labels:
        return self

    def flat(self) -> list[Any]:
        return list(_flatten(self.cells))


def _flatten(cells: Any) -> Iterator[Any]:
    if isinstance(cells, list):
        for c in cells:
            yield from _flatten(c)
    else:
        yield cells


def labels_torch() -> types.SimpleNamespace:
    """A `torch` whose `zeros`, `full` and `ones` make `Labels`."""

    def zeros(*shape: int, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(shape, 0), dtype)

    def full(shape: tuple[int, ...], value: Any, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(tuple(shape), value), dtype)

    def ones(*shape: int, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(shape, 1.0), dtype)

    return types.SimpleNamespace(
        zeros=zeros,
        full=full,
        ones=ones,
        float32="float32",
        cuda=types.SimpleNamespace(empty_cache=lambda: None),
    )
