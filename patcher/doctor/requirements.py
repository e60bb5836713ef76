"""Whether the environment that runs SGLang holds what SGLang requires (torch first of all).

Read as pip reads it: SGLang's own dist-info names its requirements (`Requires-Dist`), and each
is installed when the environment holds its dist-info, or its interpreter finds it (a virtual
environment that includes the system's site-packages, as on NVIDIA's PyTorch images). Only an
environment's site-packages (`<prefix>/lib/python3.X/site-packages`) is judged: a folder made by
`pip install --target` is put on `PYTHONPATH` beside others, so what it lacks may be elsewhere.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor.kernels.packages import Distributions, normalize, read_text


class Missing(NamedTuple):
    """A requirement of SGLang the environment lacks, and where the requirement was read."""

    name: str
    requirement: str  # as SGLang's metadata writes it: `torch==2.9.1`
    source: str  # the METADATA it was read in, or why it is required without one
    prefix: Path  # the environment's root
    python: Path  # its interpreter, which installs the fix


def environment_prefix(site: Path) -> Path | None:
    """The root of the environment `site` belongs to; None for a folder of another shape."""
    python = site.parent
    if (
        site.name in ("site-packages", "dist-packages")
        and python.name.startswith("python3")
        and python.parent.name in ("lib", "lib64")
    ):
        return python.parent.parent
    return None


def missing(site: Path) -> list[Missing] | None:
    """SGLang's requirements that `site`'s environment lacks; None: not an environment."""
    prefix = environment_prefix(site)
    if prefix is None:
        return None
    wanted = _required(site)
    dists = Distributions(site)
    absent = [w for w in wanted if dists.version(w[0]) is None]
    if not absent:
        return []
    python = interpreter(prefix, site.parent.name)
    # Without one there is nothing to ask (and nothing to start SGLang with either).
    found = _found_by_interpreter(python, [n for n, _, _ in absent]) if python else set()
    python = python or prefix / "bin" / "python"
    return [Missing(n, r, s, prefix, python) for n, r, s in absent if normalize(n) not in found]


def interpreter(prefix: Path, version: str) -> Path | None:
    """The environment's interpreter: `bin/python`, `bin/python3` or `bin/python3.X` (Debian's
    /usr/local has only the last two)."""
    for name in ("python", "python3", version):
        candidate = prefix / "bin" / name
        if candidate.is_file():
            return candidate
    return None


# Without SGLang's metadata (an editable install by a bare `.pth`), the one requirement known:
# SGLang imports torch as it starts.
_TORCH = ("torch", "torch", "SGLang imports it at start")
_REQUIREMENT_RE = re.compile(r"^Requires-Dist:\s*([A-Za-z0-9][A-Za-z0-9._-]*)([^;\n]*)$", re.M)


def _required(site: Path) -> list[tuple[str, str, str]]:
    """(name, requirement, source) for each unconditional `Requires-Dist` of SGLang's
    dist-info in `site`; torch alone when there is none. A requirement with a marker (an
    extra, a platform) is left out: it may not apply here."""
    for info in sorted(site.glob("sglang-*.dist-info")):
        text = read_text(info / "METADATA")
        if text is None or not re.search(r"^Name:\s*sglang\s*$", text, re.I | re.M):
            continue
        header = text.split("\n\n", 1)[0]  # the body is the description
        source = str(info / "METADATA")
        return [
            (m.group(1), m.group(1) + "".join(m.group(2).split()), source)
            for m in _REQUIREMENT_RE.finditer(header)
        ]
    return [_TORCH]


def _found_by_interpreter(python: Path, names: list[str]) -> set[str]:
    """Which of `names` the environment's interpreter finds installed elsewhere (normalized)."""
    ask = (
        "import importlib.metadata as m, sys\n"
        "for n in sys.argv[1:]:\n"
        "    try: m.distribution(n); print(n)\n"
        "    except Exception: pass\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", ask, *names],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {normalize(line.strip()) for line in done.stdout.splitlines() if line.strip()}
