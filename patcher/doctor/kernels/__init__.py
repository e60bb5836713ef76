"""doctor's kernels section: will the compiled packages beside SGLang run on capability 12?

Half of what stops SGLang on capability 12 is in the wheels beside it (`no kernel image is
available for execution on the device`). This package reads them without importing any and
without a GPU: the CUDA fat binaries in their ELF libraries (`elf`, `fatbin`), standalone
cubins, sgl-kernel's own loader (`packages`), and the compilers run at run time (`tools`,
`triton_ptxas`); `archs` holds CUDA's rules for what runs where, `findings` the findings.

    findings = inspect(site_packages)            # list[KernelFinding]
    lines = render(findings, ("12.0", "12.1"))   # the human report's section
    [f.to_json() for f in findings]              # the JSON "kernels" list
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.doctor.kernels import inspectors
from sglpatch.doctor.kernels.findings import KernelFinding, not_judged, render
from sglpatch.doctor.kernels.packages import Distributions
from sglpatch.doctor.kernels.triton_ptxas import inspect_triton

__all__ = ["KernelFinding", "inspect", "render"]


def inspect(
    site_packages: Path,
    capabilities: Sequence[str] = CAPABILITIES,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[KernelFinding]:
    """One finding per kernel package in `site_packages`, in a fixed order; never raises.

    `environ` (default: this process's) decides TRITON_PTXAS_PATH, CUDA_HOME and PATH.
    """
    env = dict(os.environ if environ is None else environ)
    caps = tuple(capabilities)
    dists = Distributions(site_packages)
    steps: list[tuple[str, Callable[[], list[KernelFinding]]]] = [
        ("torch", lambda: [inspectors.torch(site_packages, dists, caps)]),
        ("sgl-kernel", lambda: [inspectors.sgl_kernel(site_packages, dists, caps)]),
        (
            "flashinfer-python",
            lambda: [inspectors.flashinfer_python(site_packages, dists, caps, env)],
        ),
        ("flashinfer-cubin", lambda: [inspectors.flashinfer_cubin(site_packages, dists, caps)]),
        (
            "flashinfer-jit-cache",
            lambda: [f for f in [inspectors.flashinfer_jit_cache(site_packages, dists, caps)] if f],
        ),
        ("deep_gemm", lambda: inspectors.run_time_compiled(site_packages, dists, caps)),
        ("triton", lambda: [inspect_triton(site_packages, dists, caps, env)]),
    ]
    findings: list[KernelFinding] = []
    for name, step in steps:
        try:
            findings.extend(step())
        except Exception as exc:  # a bug or an unforeseen file must not stop doctor
            findings.append(not_judged(name, None, caps, f"could not be read: {exc!r}"))
    return findings
