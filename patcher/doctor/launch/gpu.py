"""Which GPUs are present: `nvidia-smi --query-gpu=compute_cap --format=csv,noheader`.

One line per GPU (`12.0`, `12.1`, `9.0`); run as doctor runs its other probes (bounded in time
and output, in its own process group, dying with doctor). Where it is not on PATH, fails, hangs
or prints what is no capability, the answer is None with the reason, never a guess.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from sglpatch.doctor.kernels import bounded

QUERY = ("--query-gpu=compute_cap", "--format=csv,noheader")
SECONDS = 10.0  # nvidia-smi answers in well under a second; a hung driver does not answer at all
_CAPABILITY = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class Gpus:
    """The compute capabilities `nvidia-smi` reported, one per GPU in its order.

    source   where they came from: "nvidia-smi" (the path it ran)
    reason   when there is no answer (`capabilities` empty): why, in words for one line
    """

    capabilities: tuple[tuple[int, int], ...]
    source: str
    reason: str = ""

    @property
    def parts(self) -> tuple[tuple[int, int], ...]:
        """The distinct capabilities, in the order first seen (two cards of one part: one)."""
        return tuple(dict.fromkeys(self.capabilities))

    def describe(self) -> str:
        """`12.0 (from nvidia-smi)`, `12.0 x2, 9.0 (from nvidia-smi)`, or why there is none."""
        if not self.capabilities:
            return f"unknown ({self.reason})"
        counted = []
        for part in self.parts:
            count = self.capabilities.count(part)
            counted.append(f"{part[0]}.{part[1]}" + (f" x{count}" if count > 1 else ""))
        return f"{', '.join(counted)} (from nvidia-smi)"


def present_gpus(environ: Mapping[str, str] | None = None, seconds: float = SECONDS) -> Gpus:
    """Ask `nvidia-smi` (found on `environ`'s PATH) which compute capabilities are present."""
    env = dict(os.environ if environ is None else environ)
    found = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if found is None:
        return Gpus((), "", "nvidia-smi is not on PATH")
    try:
        ran = bounded.run([found, *QUERY], env, seconds)
    except OSError as error:
        return Gpus((), found, f"nvidia-smi could not be started: {error.strerror or error}")
    if ran.over:
        return Gpus((), found, f"nvidia-smi was stopped at its {ran.over} bound ({seconds:g} s)")
    text = ran.output.decode(errors="replace")
    if ran.returncode != 0:
        said = _first_line(text)
        return Gpus(
            (), found, f"nvidia-smi failed (exit {ran.returncode}{': ' + said if said else ''})"
        )
    return parse_capabilities(text, found)


def parse_capabilities(text: str, source: str = "nvidia-smi") -> Gpus:
    """Capabilities from `nvidia-smi`'s output, one per line; anything else makes it None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return Gpus((), source, "nvidia-smi listed no GPU")
    capabilities = []
    for line in lines:
        match = _CAPABILITY.fullmatch(line)
        if match is None:
            return Gpus((), source, f"nvidia-smi printed {line[:60]!r}, not a compute capability")
        capabilities.append((int(match.group(1)), int(match.group(2))))
    return Gpus(tuple(capabilities), source)


def _first_line(text: str) -> str:
    return next((line.strip()[:100] for line in text.splitlines() if line.strip()), "")
