"""The compilers a kernel package runs at run time: Triton's `ptxas`, FlashInfer's `nvcc`.

Each is asked only `--version` and `--help` (no input, no files written), both within one
time limit and each within an output limit (`bounded`), so a stand-in script or a broken binary
costs at most that limit, never hangs doctor, and never outlives it.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor.kernels import bounded
from sglpatch.doctor.kernels.archs import parse_capability

_TIMEOUT_S = 10.0  # for a tool's --version and --help together
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_ALLOWED = re.compile(r"Allowed values for this option:(.*?)(?:\n\s*\n|\n--|\Z)", re.S)

# First CUDA release whose ptxas/nvcc accepts each arch-specific target, for a tool whose
# `--help` lists no values: sm_120a came with CUDA 12.8, sm_121a with 12.9 (CUDA 12.8 and
# 12.9 release notes; checked: ptxas 12.8.93 lists sm_120a and no sm_121*, 12.9.86 both).
FIRST_RELEASE = {"sm_120a": (12, 8), "sm_121a": (12, 9), "sm_120f": (12, 9), "sm_121f": (12, 9)}


class Tool(NamedTuple):
    """One compiler as found: where, which release, and the targets it names."""

    path: Path
    release: tuple[int, int] | None
    targets: frozenset[str]  # from --help; empty when the tool lists none
    problem: str  # "" when it answered

    @property
    def release_text(self) -> str:
        return f"{self.release[0]}.{self.release[1]}" if self.release else "unknown"

    def knows(self, target: str) -> bool | None:
        """Whether it can compile for `target` (`sm_121a`); None when that cannot be told."""
        if self.problem:
            return None
        if self.targets:
            return target in self.targets
        first = FIRST_RELEASE.get(target)
        if first is None or self.release is None:
            return None
        return self.release >= first

    def arch_specific(
        self, caps: Sequence[str]
    ) -> tuple[dict[str, bool | None], list[str], list[str]]:
        """Per capability, whether it knows that capability's `sm_<major><minor>a`, which Triton
        and FlashInfer's JIT compile for; then the targets it knows and those it lacks."""
        runs: dict[str, bool | None] = {}
        wanted = []
        for cap in caps:
            c = parse_capability(cap)
            runs[cap] = None if c is None else self.knows(f"sm_{c[0]}{c[1]}a")
            if c is not None:
                wanted.append(f"sm_{c[0]}{c[1]}a")
        knows = [t for t in wanted if self.knows(t)]
        lacks = [t for t in wanted if self.knows(t) is False]
        return runs, knows, lacks


def probe(path: Path, environ: Mapping[str, str]) -> Tool:
    """Run `path --version` and `path --help`; a tool that cannot run says why."""
    try:
        st = path.stat()
    except OSError:
        return Tool(path, None, frozenset(), "not found")
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return Tool(path, None, frozenset(), "not an executable file")
    deadline = time.monotonic() + _TIMEOUT_S
    version, problem = _run(path, "--version", environ, deadline)
    if problem:
        return Tool(path, None, frozenset(), problem)
    found = _RELEASE.search(version)
    release = (int(found.group(1)), int(found.group(2))) if found else None
    helptext, _ = _run(path, "--help", environ, deadline)
    allowed = _ALLOWED.search(helptext)
    targets = frozenset(re.findall(r"'([a-z]+_\d+[a-z]?)'", allowed.group(1))) if allowed else None
    if release is None and not targets:
        return Tool(path, None, frozenset(), "its --version names no CUDA release")
    return Tool(path, release, targets or frozenset(), "")


def _run(path: Path, flag: str, environ: Mapping[str, str], deadline: float) -> tuple[str, str]:
    left = deadline - time.monotonic()
    if left <= 0:  # --version took the time --help would have had
        return "", f"`{path.name} {flag}` ran longer than {_TIMEOUT_S:g} s"
    try:
        ran = bounded.run([str(path), flag], environ, left)
    except OSError as exc:
        return "", f"cannot run: {exc.strerror or exc}"
    if ran.over == "time":
        return "", f"`{path.name} {flag}` ran longer than {_TIMEOUT_S:g} s"
    if ran.over == "output":
        most = bounded.MOST_BYTES / (1 << 20)
        return "", f"`{path.name} {flag}` printed more than {most:g} MiB"
    text = ran.output.decode("utf-8", "replace")
    if ran.returncode != 0 and flag == "--version":
        return text, f"`{path.name} --version` exited {ran.returncode}"
    return text, ""


def which(name: str, environ: Mapping[str, str]) -> Path | None:
    """`name` on the PATH of `environ`, as a shell would find it."""
    for folder in environ.get("PATH", "").split(os.pathsep):
        if folder:
            candidate = Path(folder) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    return None


def flashinfer_nvcc(environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The nvcc FlashInfer's JIT would run, and how it was chosen.

    As flashinfer/jit/cpp_ext.py (0.6): $FLASHINFER_NVCC, else $CUDA_HOME or $CUDA_PATH
    /bin/nvcc, else the nvcc on PATH, else /usr/local/cuda/bin/nvcc.
    """
    if environ.get("FLASHINFER_NVCC"):
        return Path(environ["FLASHINFER_NVCC"]), "FLASHINFER_NVCC"
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            return Path(environ[var]) / "bin" / "nvcc", var
    on_path = which("nvcc", environ)
    if on_path is not None:
        return on_path, "PATH"
    default = Path("/usr/local/cuda/bin/nvcc")
    return (default, "default") if default.exists() else (None, "")
