"""The environment that runs the target: its site-packages, what SGLang requires there and is
not installed, and the compiled kernels beside SGLang; each gap as a blocker no patch fixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor import kernels, requirements
from sglpatch.doctor.kernels import KernelFinding
from sglpatch.doctor.report import ENVIRONMENT, KERNELS, Blocker, Origin
from sglpatch.target import Layout, Target

# How discovery names an environment it found SGLang through (`<how> at <prefix>`).
_THROUGH_ENVIRONMENT = (
    "$VIRTUAL_ENV at ",
    "$CONDA_PREFIX at ",
    "this Python at ",
    "python3 on PATH at ",
)


class Environment(NamedTuple):
    """What doctor read of the environment beside the tree."""

    site: Path  # its site-packages
    kernels: tuple[KernelFinding, ...]
    missing: tuple[Blocker, ...]  # SGLang's requirements not installed (listed first)
    failing: tuple[Blocker, ...]  # kernel packages without code for a capability asked (last)


def read(target: Target, capabilities: Sequence[str]) -> Environment | None:
    """The environment's gaps, or None when no environment is known (a checkout)."""
    site = site_packages(target)
    if site is None:
        return None
    lacking = requirements.missing(site) or []
    found = tuple(kernels.inspect(site, capabilities))
    failing = tuple(
        _kernel_blocker(f, capabilities) for f in found if any(map(f.blocks, capabilities))
    )
    missing = tuple(_missing_blocker(m, target) for m in lacking)
    return Environment(site, found, missing, failing)


def site_packages(target: Target) -> Path | None:
    """The site-packages whose kernels SGLang runs with: the target's own, or for a checkout,
    that of the environment `--target` named or discovery found it through (an editable
    install); else None."""
    if target.layout is Layout.SITE_PACKAGES:
        return target.root
    if target.environment is not None:
        return target.environment
    if target.found_by is None or not target.found_by.startswith(_THROUGH_ENVIRONMENT):
        return None  # a checkout given by --target or found from the current folder
    prefix = Path(target.found_by.split(" at ", 1)[1])
    sites = sorted(prefix.glob("lib/python3*/site-packages"))
    return sites[0] if sites else None


def _missing_blocker(missing: requirements.Missing, target: Target) -> Blocker:
    if missing.source.endswith("METADATA"):
        why = f"SGLang {target.release} requires {missing.requirement} ({missing.source})"
    else:
        why = f"SGLang requires it ({missing.source})"
    python = missing.python
    return Blocker(
        f"{missing.name} is not installed in the environment at {missing.prefix}: {why}",
        ENVIRONMENT,
        None,
        f"{python} -m pip install '{missing.requirement}'",
        origin=Origin.ENVIRONMENT,
    )


def _kernel_blocker(finding: KernelFinding, capabilities: Sequence[str]) -> Blocker:
    failing = [cap for cap in capabilities if finding.blocks(cap)]
    return Blocker(
        f"{finding.package} {finding.version} does not run on {' and '.join(failing)}: "
        f"{finding.why}",
        KERNELS,
        None,
        finding.fix,
        origin=Origin.KERNELS,
        parts=() if len(failing) == len(capabilities) else tuple(failing),
    )
