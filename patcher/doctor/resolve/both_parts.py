"""12.0 and 12.1 answered by one start-up resolution, where the release never lets the minor
decide.

The stand-in device reports `(12, m)`, `m` an int equal to 0 (12.0's answer) that also carries 1
(12.1's). Whatever the release computes from it carries both; a comparison, a hash, a string or
a truth value that differs between the two notes `DIVERGED` and goes on as 12.0. The device's
name and its host CPU differ too, so reading either notes it as well. A run that ends with
nothing noted took every decision the same way on both parts: its outcomes are 12.1's as they
are. Anything else (and any reading of the raw value that bypasses Python's operators) is
answered by a second run on 12.1, which a noted divergence asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Divergence:
    """Whether a run on `BOTH` took a step that 12.0 and 12.1 would take apart."""

    def __init__(self) -> None:
        self.seen = False


DIVERGED = Divergence()

# The int methods a value may be used through without the difference showing: construction,
# attribute plumbing, introspection.
_PLUMBING = frozenset(
    {
        "__class__",
        "__new__",
        "__init__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__init_subclass__",
        "__subclasshook__",
        "__doc__",
        "__dir__",
        "__sizeof__",
        "__getnewargs__",
        "__reduce__",
        "__reduce_ex__",
        "__getstate__",
    }
)
# The methods whose int result is a new value (carried on for both parts); any other result
# must be the same on both.
_ARITHMETIC = frozenset(
    f"__{r}{op}__"
    for op in (
        "add", "sub", "mul", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or", "xor",
    )
    for r in ("", "r")
) | {"__neg__", "__pos__", "__abs__", "__invert__"}  # fmt: skip


class TwoMinors(int):
    """A value of 12.0's run (the int it is) that carries 12.1's (`other`)."""

    other: int

    def __new__(cls, mine: int, other: int) -> TwoMinors:
        value = super().__new__(cls, mine)
        value.other = other
        return value

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return TwoMinors, (int.__int__(self), self.other)


def _apart(name: str) -> Callable[..., Any]:
    plain = getattr(int, name)

    def method(self: TwoMinors, *args: Any) -> Any:
        mine = plain(int.__int__(self), *(_part(a, 0) for a in args))
        other = plain(self.other, *(_part(a, 1) for a in args))
        if mine is NotImplemented or other is NotImplemented:
            return NotImplemented
        if name in _ARITHMETIC and type(mine) is int and type(other) is int:
            return TwoMinors(mine, other) if mine != other else mine
        if mine != other:
            DIVERGED.seen = True
        return mine

    method.__name__ = name
    return method


def _part(value: Any, which: int) -> Any:
    if isinstance(value, TwoMinors):
        return value.other if which else int.__int__(value)
    return value


def _int(self: TwoMinors) -> int:
    if int.__int__(self) != self.other:
        DIVERGED.seen = True
    return int.__int__(self)


for _name in dir(int):
    if _name.startswith("__") and _name not in _PLUMBING and callable(getattr(int, _name)):
        setattr(TwoMinors, _name, _apart(_name))
TwoMinors.__int__ = TwoMinors.__index__ = _int  # type: ignore[method-assign,assignment]


def _other_attribute(self: TwoMinors, name: str) -> Any:
    if not name.startswith("__") and name != "other":  # bit_length(), real, to_bytes(): raw
        DIVERGED.seen = True
    return object.__getattribute__(self, name)


TwoMinors.__getattribute__ = _other_attribute  # type: ignore[method-assign,assignment]

BOTH: tuple[int, int] = (12, TwoMinors(0, 1))  # 12.0's run, answering for 12.1 where it can
PARTS = ("12.0", "12.1")


def is_both(capability: tuple[int, int]) -> bool:
    return isinstance(capability[1], TwoMinors)
