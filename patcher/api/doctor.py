"""`doctor`: will the target run on capability-12 GPUs, with EAGLE-3 on a model? From its source."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sglpatch import catalogue, collector
from sglpatch.errors import UsageError
from sglpatch.reading import read_regular
from sglpatch.reports import DoctorReport
from sglpatch.target import Layout, Target, find_target, parse_release

if TYPE_CHECKING:
    from sglpatch.doctor import requirements
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
    capability: str | None = None,
) -> DoctorReport:
    """Will the target run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`), a models module's
    stem (`kimi_k25`) or a Hugging Face id (`moonshotai/Kimi-K2.5`, read in the local hub
    cache); `model_path` is a checkpoint folder whose config.json names it, or a Hugging Face
    id when no such folder exists (as SGLang's own --model-path). A release that cannot be read
    is a usage error unless `version` gives it: which patches the tree needs depends on it, so
    "ready" could not be known. `capability` ("12.0" or "12.1") asks about one part; None:
    both.
    """
    with collector.paused(settle=True):
        return _diagnose(
            target_path, model, catalog, model_path, strict, progress, version, capability
        )


def _diagnose(
    target_path: Path | None,
    model: str | None,
    catalog: Path | None,
    model_path: Path | None,
    strict: bool,
    progress: Callable[[str], None] | None,
    version: str | None,
    capability: str | None,
) -> DoctorReport:
    capabilities = _capabilities(capability)
    target = find_target(target_path, parse_release(version) if version else None)
    model, model_from = model_asked(model, model_path)
    from sglpatch.doctor import verdict  # its scanners load only for this command

    result = verdict.diagnose(
        target.package_dir,
        target.release,
        catalogue.load(catalog),
        model,
        strict=strict,
        progress=progress,
        capabilities=capabilities,
    )
    site = _environment(target)
    if site is None:
        return DoctorReport(target, result, None, model_from=model_from)
    from sglpatch.doctor import kernels, requirements

    lacking = requirements.missing(site) or []
    found = tuple(kernels.inspect(site, capabilities))
    blockers = tuple(
        _kernel_blocker(f, capabilities) for f in found if any(map(f.blocks, capabilities))
    )
    needed = tuple(_missing_blocker(m, target) for m in lacking)
    result = result._replace(blockers=needed + result.blockers + blockers)
    return DoctorReport(target, result, found, site, model_from)


# How discovery names an environment it found SGLang through (`<how> at <prefix>`).
_THROUGH_ENVIRONMENT = (
    "$VIRTUAL_ENV at ",
    "$CONDA_PREFIX at ",
    "this Python at ",
    "python3 on PATH at ",
)


def _environment(target: Target) -> Path | None:
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


# The source of a blocker in the environment itself: a requirement of SGLang not installed.
ENVIRONMENT = "the environment"


def _missing_blocker(missing: requirements.Missing, target: Target) -> Blocker:
    from sglpatch.doctor.verdict import Blocker

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
    )


# Both capability-12 parts: 12.0 (RTX PRO 6000, RTX 5090) and 12.1 (GB10, DGX Spark).
CAPABILITIES = ("12.0", "12.1")
# The source of a blocker in a compiled package beside SGLang: no patch of sglpatch's fixes it.
KERNELS = "the installed kernels"


def _capabilities(capability: str | None) -> tuple[str, ...]:
    """The capabilities asked about: one of `CAPABILITIES`, or both."""
    if capability is None:
        return CAPABILITIES
    if capability not in CAPABILITIES:
        raise UsageError(f"--capability {capability}: one of {', '.join(CAPABILITIES)}")
    return (capability,)


def _kernel_blocker(
    finding: KernelFinding, capabilities: tuple[str, ...] = CAPABILITIES
) -> Blocker:
    from sglpatch.doctor.verdict import Blocker

    failing = [cap for cap in capabilities if finding.blocks(cap)]
    return Blocker(
        f"{finding.package} {finding.version} does not run on {' and '.join(failing)}: "
        f"{finding.why}",
        KERNELS,
        None,
        finding.fix,
    )


def model_asked(model: str | None, model_path: Path | None) -> tuple[str | None, Path | None]:
    """The architecture or models module `--model` / `--model-path` ask for, and the config.json
    it was read from (None when `--model` names it itself)."""
    from sglpatch import hub

    if model_path is not None:
        if model is not None:
            raise UsageError("give --model or --model-path, not both")
        # A folder first, as SGLang does; `moonshotai/Kimi-K2.5` that is none is a hub id.
        # (os.path: Path.is_dir raises on a folder this user may not look into.)
        folder = os.path.isdir(model_path)  # noqa: PTH112
        if folder or not hub.is_repo_id(str(model_path)):
            config = model_path / "config.json"
            return _architecture(config, f"--model-path {model_path}"), config
        return _from_hub(str(model_path), "--model-path")
    if model is None:
        return None, None
    if "/" in model and hub.is_repo_id(model):
        return _from_hub(model, "--model")
    if hub.is_repo_id(model) and not model.isidentifier():
        # Not a module's stem nor a class: a hub name (`GLM-5.3-Flash`) or a near miss of one
        # (`kimi-k2.5`, which the census answers with its closest modules and classes).
        cached = hub.cached_as(model)
        if any("/" not in c for c in cached):  # an id without ORG (`bert-base-uncased`)
            return _from_hub(model, "--model")
        if cached:
            raise UsageError(
                f"--model {model} looks like a Hugging Face model name, not a models module or "
                f"architecture; the local Hugging Face cache holds {', '.join(cached)}: pass "
                f"--model {cached[0]}"
            )
    return model, None


def _from_hub(repo_id: str, option: str) -> tuple[str, Path]:
    from sglpatch import hub

    try:
        found = hub.find(repo_id)
    except hub.NotCached as why:
        folder = "no such folder, and " if option == "--model-path" else ""
        raise UsageError(
            f"{option} {repo_id}: {folder}not in the local Hugging Face cache ({why}); sglpatch "
            f"downloads nothing: fetch its config with `hf download {repo_id} config.json`, or "
            "pass --model-path DIR (a checkpoint folder) or --model ARCHITECTURE (its "
            "config.json's architectures[0])"
        ) from None
    said = f"{option} {repo_id} (cached as {found.config})"
    return _architecture(found.config, said), found.config


def _architecture(config: Path, said: str) -> str:
    """The first architecture a checkpoint's config.json names, as SGLang picks its class.

    `said` starts each error line: the option and where the file is.
    """
    import json

    from sglpatch.doctor.census import is_model_name, shown_name

    limit = 64 << 20  # bytes: a checkpoint's config.json is a few KB; never a FIFO's wait
    try:
        data = json.loads(read_regular(config, limit).decode("utf-8"))
    except FileNotFoundError:
        if not os.path.lexists(config):
            raise UsageError(f"{said}: no config.json there") from None
        raise UsageError(f"{said}: cannot read config.json: a link to nothing") from None
    except OSError as error:
        why = error.strerror or str(error)
        raise UsageError(f"{said}: cannot read config.json: {why}") from None
    except RecursionError:
        raise UsageError(f"{said}: cannot read config.json: nested too deeply") from None
    except ValueError as error:  # not UTF-8, not JSON
        why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UsageError(f"{said}: cannot read config.json: {why}") from None
    names = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"{said}: config.json names no architectures")
    if not is_model_name(names[0]):
        raise UsageError(
            f"{said}: config.json's architecture {shown_name(names[0])} is not a class name"
        )
    return names[0]
