"""Triton: its version and the ptxas it compiles every kernel with on capability 12.

Triton lowers each kernel to PTX and runs ptxas for `sm_<capability>a` (for capability 9 and
up: `sm_arch_from_capability` in triton/backends/nvidia/compiler.py), so on GB10 (12.1) a
ptxas that predates `sm_121a` fails every compile: "ptxas fatal : Value 'sm_121a' is not
defined for option 'gpu-name'". The wheel ships its ptxas in backends/nvidia/bin/;
TRITON_PTXAS_PATH overrides it (triton/knobs.py, `env_nvidia_tool`), falling back to the
bundled one when the override does not run. From about Triton 3.6 a second binary,
`ptxas-blackwell` (TRITON_PTXAS_BLACKWELL_PATH), serves capability 9 and later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sglpatch.doctor.kernels import tools
from sglpatch.doctor.kernels.findings import KernelFinding, not_judged
from sglpatch.doctor.kernels.packages import Distributions, literals, read_text

_FIX = (
    "set {var} to a ptxas from CUDA 12.9 or later: `pip install nvidia-cuda-nvcc-cu12==12.9.86`"
    " ships site-packages/nvidia/cuda_nvcc/bin/ptxas (or a CUDA toolkit's bin/ptxas)"
)


def ptxas_for_capability_12(pkg: Path) -> tuple[Path, str]:
    """The bundled binary Triton runs for capability 12, and the variable that overrides it."""
    compiler = read_text(pkg / "backends" / "nvidia" / "compiler.py") or ""
    blackwell = pkg / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    if "ptxas_blackwell" in compiler and blackwell.exists():
        return blackwell, "TRITON_PTXAS_BLACKWELL_PATH"
    return pkg / "backends" / "nvidia" / "bin" / "ptxas", "TRITON_PTXAS_PATH"


def inspect_triton(
    sp: Path, dists: Distributions, caps: Sequence[str], environ: Mapping[str, str]
) -> KernelFinding:
    pkg = sp / "triton"
    version = dists.version("triton") or literals(pkg / "__init__.py", "__version__").get(
        "__version__"
    )
    if not pkg.is_dir():
        return not_judged("triton", None, caps, "not installed in this environment")
    bundled, var = ptxas_for_capability_12(pkg)
    tool = tools.probe(bundled, environ)
    source = "bundled"
    override = environ.get(var)
    if override:
        chosen = tools.probe(Path(override), environ)
        if not chosen.problem:
            tool, source = chosen, f"${var}"
    rel = bundled.relative_to(sp).as_posix() if source == "bundled" else str(tool.path)
    details = {"ptxas": str(tool.path), "ptxas_from": source, "ptxas_version": tool.release_text}
    if tool.problem:
        return not_judged("triton", version, caps, f"ptxas {rel}: {tool.problem}", **details)
    runs, knows, lacks = tool.arch_specific(caps)  # Triton compiles `sm_<cap>a` (compiler.py)
    why = f"ptxas {rel} ({source}) is CUDA {tool.release_text}"
    why += f"; it knows {', '.join(knows)}" if knows else ""
    why += f"; it does not know {', '.join(lacks)}: every kernel compile fails" if lacks else ""
    fix = _FIX.format(var=var) if any(v is False for v in runs.values()) else ""
    return KernelFinding("triton", version, runs, why, fix, True, details)
