"""One function per kernel package: find it, read its binaries, return its finding.

Every function returns a finding whatever it meets; a file that cannot be read makes the
package "not judged" with the reason (the caller adds a last guard for bugs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from sglpatch.doctor.kernels import elf, fatbin
from sglpatch.doctor.kernels.archs import Code, parse_capability
from sglpatch.doctor.kernels.findings import (
    KernelFinding,
    binary_finding,
    explain,
    judge_codes,
    not_judged,
)
from sglpatch.doctor.kernels.packages import Distributions, literals, sgl_kernel_build
from sglpatch.reading import files_under

Caps = Sequence[str]
_NOT_INSTALLED = "not installed in this environment"


def _library(path: Path) -> Counter[Code] | str:
    """The codes of one host library, or why it cannot be read."""
    try:
        codes, _compressed, _section = fatbin.codes_in_library(path)
    except elf.BadBinary as exc:
        return f"{path.name}: {exc}"
    return codes


def _binaries(folder: Path, suffix: str) -> tuple[list[Path], list[str]]:
    """The files under `folder` named `*suffix`, sorted; and why each subfolder that cannot be
    listed is not read, where `Path.rglob` skips it in silence."""
    found, unlisted = files_under(folder, suffix)
    return found, [
        f"{where.relative_to(folder.parent).as_posix()}/: cannot be listed: "
        f"{error.strerror or error}"
        for where, error in unlisted
    ]


def torch(sp: Path, dists: Distributions, caps: Caps) -> KernelFinding:
    pkg = sp / "torch"
    lits = literals(pkg / "version.py", "__version__", "cuda", "hip")
    version = dists.version("torch") or lits.get("__version__")
    if not pkg.is_dir():
        return not_judged("torch", None, caps, _NOT_INSTALLED)
    if "cuda" in lits and lits["cuda"] is None:
        kind = f"a ROCm build (hip {lits['hip']})" if lits.get("hip") else "a CPU-only build"
        return KernelFinding(
            "torch",
            version,
            dict.fromkeys(caps, False),
            f"{kind} (torch/version.py: cuda = None)",
            "a CUDA 12.8+ build of torch (the cu128 and later wheels carry sm_120 SASS)",
            True,
        )
    lib = pkg / "lib" / "libtorch_cuda.so"
    codes = _library(lib)
    if isinstance(codes, str):
        return not_judged("torch", version, caps, codes, cuda=lits.get("cuda"))
    return binary_finding(
        "torch",
        version,
        f"built for CUDA {lits.get('cuda', '?')}, lib/libtorch_cuda.so",
        codes,
        caps,
        fix="a torch built with CUDA 12.8 or later (cu128+ wheels carry sm_120 SASS)",
        required=True,
        cuda=lits.get("cuda"),
    )


# The SASS each capability-12 part runs: its own arch-specific code, or the family's.
_NEEDED = {"12.0": "sm_120a or sm_120f", "12.1": "sm_121a or sm_120f"}


def sgl_kernel(sp: Path, dists: Distributions, caps: Caps) -> KernelFinding:
    pkg = sp / "sgl_kernel"
    name = "sglang-kernel" if dists.version("sglang-kernel") else "sgl-kernel"
    version = dists.version(name) or literals(pkg / "version.py", "__version__").get("__version__")
    if not pkg.is_dir():
        return not_judged("sgl-kernel", None, caps, _NOT_INSTALLED)
    runs: dict[str, bool | None] = {}
    notes: list[str] = []
    files: dict[str, str] = {}
    archs: dict[str, dict[str, int]] = {}
    explained: dict[str, list[str]] = {}
    for cap in caps:
        capability = parse_capability(cap)
        if capability is None:
            runs[cap] = None
            continue
        loader = sgl_kernel_build(pkg, capability)
        if loader.subdir is None:
            runs[cap] = None
            notes.append(f"{cap}: not judged: {loader.how}")
            continue
        folder = pkg / loader.subdir if loader.subdir else pkg
        libs = sorted(p for p in folder.glob("common_ops.*") if ".so" in p.name)
        if not libs:
            runs[cap] = None
            notes.append(f"{cap}: not judged: {loader.how}, which holds no common_ops library")
            continue
        rel = libs[0].relative_to(sp).as_posix()
        codes = _library(libs[0])
        if isinstance(codes, str):
            runs[cap] = None
            notes.append(f"{cap}: not judged: {codes}")
            continue
        runs[cap] = judge_codes(codes, [cap])[cap]
        files[cap] = rel
        archs[rel] = {c.name: n for c, n in sorted(codes.items())}
        explained.setdefault(rel, []).append(explain(codes, cap))
    why = [
        f"{rel} (loaded on {' and '.join(c for c, r in files.items() if r == rel)}): "
        + " ".join(archs[rel])
        + "; "
        + "; ".join(lines)
        for rel, lines in explained.items()
    ] + notes
    failing = [cap for cap, ok in runs.items() if ok is False]
    fix = ""
    if failing:
        # From what was read in this environment, never from remembered wheels: the same
        # release's wheels differ by platform (aarch64's carry sm_121a, x86_64's do not).
        needed = " or ".join(_NEEDED.get(cap, "its code") for cap in failing)
        carried = "; ".join(
            f"the installed {rel} carries {' '.join(archs[rel])}"
            for rel in dict.fromkeys(files[cap] for cap in failing if cap in files)
        )
        fix = f"an sgl-kernel whose common_ops has {needed} code, built with CUDA 12.9+" + (
            f" ({carried})" if carried else ""
        )
    return KernelFinding(
        name, version, runs, "; ".join(why), fix, True, {"loads": files, "archs": archs}
    )


def flashinfer_python(
    sp: Path, dists: Distributions, caps: Caps, environ: Mapping[str, str]
) -> KernelFinding:
    from sglpatch.doctor.kernels import tools

    version = dists.version("flashinfer-python")
    if version is None and not (sp / "flashinfer").is_dir():
        return not_judged("flashinfer-python", None, caps, _NOT_INSTALLED)
    nvcc, how = tools.flashinfer_nvcc(environ)
    if nvcc is None:
        return KernelFinding(
            "flashinfer-python",
            version,
            dict.fromkeys(caps, False),
            "JIT-compiles its kernels with nvcc, and none is found"
            " (FLASHINFER_NVCC, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)",
            "install CUDA 12.9+ (12.8+ for 12.0 alone) and set CUDA_HOME to it",
            True,
        )
    tool = tools.probe(nvcc, environ)
    if tool.problem:
        return not_judged(
            "flashinfer-python", version, caps, f"its JIT nvcc {nvcc} ({how}): {tool.problem}"
        )
    # FlashInfer compiles `sm_<major><minor>a` for majors 9 and up (compilation_context.py).
    runs, knows, lacks = tool.arch_specific(caps)
    why = f"JIT-compiles with {nvcc} (from {how}), CUDA {tool.release_text}"
    why += f"; it knows {', '.join(knows)}" if knows else ""
    why += f"; it does not know {', '.join(lacks)}" if lacks else ""
    failing = [cap for cap, ok in runs.items() if ok is False]
    fix = (
        f"point CUDA_HOME (or FLASHINFER_NVCC) at a CUDA {'12.9' if '12.1' in failing else '12.8'}"
        "+ toolkit"
        if failing
        else ""
    )
    return KernelFinding(
        "flashinfer-python", version, runs, why, fix, True, {"nvcc": str(nvcc), "nvcc_from": how}
    )


def flashinfer_cubin(sp: Path, dists: Distributions, caps: Caps) -> KernelFinding:
    version = dists.version("flashinfer-cubin")
    folder = sp / "flashinfer_cubin" / "cubins"
    if not folder.is_dir():
        return not_judged("flashinfer-cubin", version, caps, _NOT_INSTALLED)
    codes: Counter[Code] = Counter()
    paths, bad = _binaries(folder, ".cubin")  # a folder not listed counts as unreadable
    for path in paths:
        try:
            codes[fatbin.cubin_code(path)] += 1
        except elf.BadBinary as exc:
            bad.append(f"{path.name}: {exc}")
    if bad and not codes:
        return not_judged("flashinfer-cubin", version, caps, bad[0], unreadable=len(bad))
    finding = binary_finding(
        "flashinfer-cubin",
        version,
        f"{sum(codes.values())} cubins",
        codes,
        caps,
        fix="",
        required=False,
        unreadable=len(bad),
    )
    # Its cubins are trtllm-gen and DeepGEMM kernels for capability 10; on 12 FlashInfer
    # JIT-compiles instead, so cubins that do not run here block nothing.
    if any(v is False for v in finding.runs_on.values()):
        why = finding.why + " (its kernels serve capability 10; on 12 FlashInfer JIT-compiles)"
        return finding._replace(why=why)
    return finding


def flashinfer_jit_cache(sp: Path, dists: Distributions, caps: Caps) -> KernelFinding | None:
    """Listed only where present: most environments JIT-compile instead."""
    version = dists.version("flashinfer-jit-cache")
    folder = sp / "flashinfer_jit_cache"
    if not folder.is_dir():
        return None
    codes: Counter[Code] = Counter()
    libs, unlisted = _binaries(folder, ".so")
    if unlisted:  # what it lacks may be in there, as for a library that cannot be read
        return not_judged("flashinfer-jit-cache", version, caps, unlisted[0])
    for lib in libs:
        got = _library(lib)
        if isinstance(got, str):
            return not_judged("flashinfer-jit-cache", version, caps, got)
        codes.update(got)
    return binary_finding(
        "flashinfer-jit-cache",
        version,
        f"{len(libs)} prebuilt modules",
        codes,
        caps,
        fix="FlashInfer JIT-compiles what the cache lacks (see flashinfer-python)",
        required=False,
    )


def run_time_compiled(sp: Path, dists: Distributions, caps: Caps) -> list[KernelFinding]:
    """DeepGEMM, triton_kernels, nvidia-cutlass-dsl: present or not, and their versions.

    They compile at run time, so no wheel file tells what a GPU will get.
    """
    found = []
    gemm_version = dists.version("sgl-deep-gemm") or dists.version("deep-gemm")
    if gemm_version is None and dists.owns("sgl-kernel", "deep_gemm/__init__.py"):
        gemm_version = f"bundled with sgl-kernel {dists.version('sgl-kernel')}"
    if gemm_version or (sp / "deep_gemm").is_dir():
        found.append(
            not_judged(
                "deep_gemm",
                gemm_version or "unknown",
                caps,
                "JIT-compiled at run time; DeepGEMM's kernels are for sm_90a and sm_100a only,"
                " so SGLang must not use it on capability 12 (sglpatch's sm120-deep-gemm-off)",
            )._replace(fix="SGLANG_ENABLE_JIT_DEEPGEMM=0, or `sglpatch apply`")
        )
    else:
        found.append(not_judged("deep_gemm", None, caps, _NOT_INSTALLED))
    kernels_version = dists.version("triton-kernels") or dists.version("triton_kernels")
    if kernels_version is None and dists.owns("sgl-kernel", "triton_kernels/__init__.py"):
        kernels_version = f"bundled with sgl-kernel {dists.version('sgl-kernel')}"
    present = kernels_version or (sp / "triton_kernels").is_dir()
    found.append(
        not_judged(
            "triton_kernels",
            (kernels_version or "unknown") if present else None,
            caps,
            "Triton source, compiled at run time (see triton)" if present else _NOT_INSTALLED,
        )
    )
    dsl = dists.version("nvidia-cutlass-dsl")
    found.append(
        not_judged(
            "nvidia-cutlass-dsl",
            dsl,
            caps,
            "compiles CuTe DSL kernels at run time with its own bundled compiler"
            if dsl
            else _NOT_INSTALLED,
        )
    )
    return found
