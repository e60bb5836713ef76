"""What to run next, as `flutter doctor` says it: `sglpatch apply` when a blocker is fixed by
it, then the user's launch without the flags that must change on capability 12
(`facts.launch_advice`). Nothing when there is nothing to do."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from packaging.version import Version

from sglpatch.doctor.facts.launch_advice import ADVICE, Advice
from sglpatch.doctor.launch.parse import Launch, Origin
from sglpatch.doctor.report import Diagnosis, Step

# A ptxas that knows sm_121a, for Triton on 12.1 (docs/kernels.md: this wheel holds only it).
PTXAS = (
    'pip install nvidia-cuda-nvcc-cu12==12.9.86 && export TRITON_PTXAS_PATH="$(python -c '
    "'import nvidia.cuda_nvcc as n; print(list(n.__path__)[0])')/bin/ptxas\""
)
# A launch given as its arguments alone is run as this command.
LAUNCH_SERVER = ("python", "-m", "sglang.launch_server")


def steps(found: Diagnosis, launch: Launch | None, apply_line: str) -> tuple[Step, ...]:
    """`apply_line` is `sglpatch apply` with the options the user gave doctor (--target,
    --release, --catalog), built by the caller as apply's own hints are; `--force` is added
    here when a blocker's release is untested."""
    out: list[Step] = []
    fixable = [b for b in found.blockers if b.fixed_by and not b.beyond_apply]
    if fixable:
        line = apply_line.replace("sglpatch apply", found.apply_command, 1)
        count = len(fixable)
        out.append(Step(line, f"fixes {count} blocker{'s' * (count != 1)}"))
    if any("ptxas" in need for need in found.needs):
        out.append(Step(PTXAS, "12.1: Triton's bundled ptxas (CUDA 12.8) does not know sm_121a"))
    if launch is None:
        return tuple(out)
    dropped = _to_drop(launch, found.release)
    if not out and not dropped:
        return ()
    why = "; ".join(a.why for a in dropped) or "the launch as given"
    return (*out, Step(_without(launch, dropped), why))


def _to_drop(launch: Launch, release: Version | None) -> list[Advice]:
    """The table's flags this launch passes that must go on 12 for `release`."""
    found = []
    for advice in ADVICE:
        if release is not None and release not in advice.releases:
            continue  # an unknown release: every row
        try:
            given = launch.get(advice.flag)
        except KeyError:
            continue  # the release has no such flag
        if not (given.origin is Origin.GIVEN and given.value):
            continue
        if advice.above_tp_one and not _above_tp_one(launch):
            continue
        found.append(advice)
    return found


def _above_tp_one(launch: Launch) -> bool:
    try:
        tp = launch.value("--tp-size")
    except KeyError:
        return False
    return isinstance(tp, int) and tp > 1


def _without(launch: Launch, dropped: Sequence[Advice]) -> str:
    """The launch line as given, each dropped flag's words removed (any spelling of it)."""
    dests: set[str] = set()
    for advice in dropped:
        option = launch.table.option(advice.flag)
        if option is not None:
            dests.add(option.dest)
    words = []
    for word in launch.argv:
        option = launch.table.option(word.split("=", 1)[0]) if word.startswith("--") else None
        if option is not None and option.dest in dests:
            continue  # these flags take no value: the word alone goes
        words.append(word)
    if not words or words[0].startswith("-"):
        words = [*LAUNCH_SERVER, *words]
    return shlex.join(words)
