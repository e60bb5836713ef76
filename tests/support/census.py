"""The package's start-up resolution (`sglpatch.doctor.resolve`) over a release's wheel, as the
census script and the patch tests ask for it: `Release(release, capability, replaced)`."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from sglpatch.doctor.resolve import (
    MODEL_CONFIG,
    Outcome,
    ReleaseFiles,
    Resolver,
    run_whole,
)
from sglpatch.doctor.resolve.stand_ins import Capability
from tests.support import wheels

__all__ = ["MODEL_CONFIG", "Outcome", "Release", "run_whole", "wheel_files"]


@functools.cache
def wheel_files(release: str) -> ReleaseFiles:
    """The release's files read from its wheel (members only, never extracted)."""
    present = frozenset(wheels.members(release, ""))

    def below(folder: str) -> list[str]:
        return sorted(p for p in present if p.startswith(folder) and p.endswith(".py"))

    def requirements() -> str:
        (metadata,) = [n for n in present if n.endswith(".dist-info/METADATA")]
        return wheels.member(release, metadata).decode().split("\n\n", 1)[0]

    return ReleaseFiles(
        lambda path: wheels.member(release, path), present.__contains__, below, requirements
    )


class Release(Resolver):
    """One release's wheel on one stand-in device."""

    def __init__(
        self, release: str, capability: Capability, replaced: Mapping[str, bytes] = {}
    ) -> None:
        self.release = release
        super().__init__(wheel_files(release), capability, replaced)
