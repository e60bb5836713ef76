"""GPU code targets and CUDA's rules for which device runs which.

Sources: the CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"
(a cubin runs on the same major with the same or a higher minor; PTX is JIT-compiled by the
driver for any equal or newer device), and the CUDA 12.9 release notes and the nvcc manual,
"GPU Feature List" (arch-specific `sm_XYa` code runs on exactly X.Y; family-specific
`sm_XYf`, new in 12.9, runs on X.Z for Z >= Y within the family). So on capability 12:
`sm_120` and `sm_120f` run on 12.0 and 12.1, `sm_120a` on 12.0 only, `sm_121a` on 12.1 only,
and no SASS of another major (sm_90, sm_100) ever runs.
"""

from __future__ import annotations

from typing import NamedTuple


class Code(NamedTuple):
    """One piece of device code: SASS (a cubin) or PTX, for one architecture."""

    kind: str  # "sass" or "ptx"
    sm: int  # 120 for sm_120 / compute_120
    variant: str = ""  # "", "a" (arch-specific) or "f" (family-specific)

    @property
    def name(self) -> str:
        prefix = "sm" if self.kind == "sass" else "compute"
        return f"{prefix}_{self.sm}{self.variant}"

    @property
    def major_minor(self) -> tuple[int, int]:
        return divmod(self.sm, 10)


def parse_capability(text: str) -> tuple[int, int] | None:
    """`"12.1"` -> (12, 1); None for anything else."""
    major, dot, minor = text.partition(".")
    if not dot or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def runs_on(code: Code, capability: tuple[int, int]) -> bool:
    """Whether a device of `capability` can run `code` (PTX: after the driver's JIT)."""
    major, minor = code.major_minor
    if code.variant == "a":
        return (major, minor) == capability
    if code.variant == "f" or code.kind == "sass":
        return major == capability[0] and minor <= capability[1]
    return (major, minor) <= capability


def summary(codes: set[Code] | frozenset[Code]) -> str:
    """`sm_90a sm_100a compute_120` in architecture order, SASS before PTX of one arch."""
    ordered = sorted(codes, key=lambda c: (c.sm, c.kind != "sass", c.variant))
    return " ".join(c.name for c in ordered) or "none"
