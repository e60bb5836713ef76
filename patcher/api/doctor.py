"""`doctor`: will the target run on capability-12 GPUs, with EAGLE-3 on a model? From its source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sglpatch import catalogue
from sglpatch.errors import UsageError
from sglpatch.reading import read_regular
from sglpatch.reports import DoctorReport
from sglpatch.target import Layout, Target, find_target, parse_release

if TYPE_CHECKING:
    from sglpatch.doctor.kernels import KernelFinding
    from sglpatch.doctor.verdict import Blocker


def diagnose(
    target_path: Path | None,
    model: str | None = None,
    catalog: Path | None = None,
    *,
    model_path: Path | None = None,
    strict: bool = False,
    progress: Callable[[str], None] | None = None,
    version: str | None = None,
) -> DoctorReport:
    """Will the target run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`) or a models module's
    stem (`kimi_k25`); `model_path` is a checkpoint folder whose config.json names it. A release
    that cannot be read is a usage error unless `version` gives it: which patches the tree
    needs depends on it, so "ready" could not be known.
    """
    target = find_target(target_path, parse_release(version) if version else None)
    if model_path is not None:
        if model is not None:
            raise UsageError("give --model or --model-path, not both")
        model = _architecture(model_path)
    from sglpatch.doctor import verdict  # its scanners load only for this command

    result = verdict.diagnose(
        target.package_dir,
        target.release,
        catalogue.load(catalog),
        model,
        strict=strict,
        progress=progress,
    )
    site = _environment(target)
    if site is None:
        return DoctorReport(target, result, None)
    from sglpatch.doctor import kernels

    found = tuple(kernels.inspect(site, CAPABILITIES))
    blockers = tuple(_kernel_blocker(f) for f in found if any(map(f.blocks, CAPABILITIES)))
    return DoctorReport(target, result._replace(blockers=result.blockers + blockers), found, site)


def _environment(target: Target) -> Path | None:
    """The site-packages whose kernels SGLang runs with: the target's own, or for a checkout,
    that of the environment discovery found it through (an editable install); else None."""
    if target.layout is Layout.SITE_PACKAGES:
        return target.root
    if target.found_by is None or " at " not in target.found_by:
        return None  # a checkout given by --target: no environment is known
    prefix = Path(target.found_by.split(" at ", 1)[1])
    sites = sorted(prefix.glob("lib/python3*/site-packages"))
    return sites[0] if sites else None


# Both capability-12 parts: 12.0 (RTX PRO 6000, RTX 5090) and 12.1 (GB10, DGX Spark).
CAPABILITIES = ("12.0", "12.1")
# The source of a blocker in a compiled package beside SGLang: no patch of sglpatch's fixes it.
KERNELS = "the installed kernels"


def _kernel_blocker(finding: KernelFinding) -> Blocker:
    from sglpatch.doctor.verdict import Blocker

    failing = [cap for cap in CAPABILITIES if finding.blocks(cap)]
    return Blocker(
        f"{finding.package} {finding.version} does not run on {' and '.join(failing)}: "
        f"{finding.why}",
        KERNELS,
        None,
        finding.fix,
    )


def _architecture(model_path: Path) -> str:
    """The first architecture a checkpoint's config.json names, as SGLang picks its class."""
    import json

    from sglpatch.doctor.census import is_model_name, shown_name

    config = model_path / "config.json"
    limit = 64 << 20  # bytes: a checkpoint's config.json is a few KB; never a FIFO's wait
    try:
        data = json.loads(read_regular(config, limit).decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--model-path {model_path}: no config.json there") from None
    except OSError as error:
        why = error.strerror or str(error)
        raise UsageError(f"--model-path {model_path}: cannot read config.json: {why}") from None
    except RecursionError:
        raise UsageError(
            f"--model-path {model_path}: cannot read config.json: nested too deeply"
        ) from None
    except ValueError as error:  # not UTF-8, not JSON
        why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UsageError(f"--model-path {model_path}: cannot read config.json: {why}") from None
    names = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"--model-path {model_path}: config.json names no architectures")
    if not is_model_name(names[0]):
        raise UsageError(
            f"--model-path {model_path}: config.json's architecture "
            f"{shown_name(names[0])} is not a class name"
        )
    return names[0]
