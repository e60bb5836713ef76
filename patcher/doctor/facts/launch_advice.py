"""Launch flags that must change on capability 12 once `sglpatch apply` has run, each with why
and its source. doctor's "Next:" lines drop them from the launch the user gave (`doctor/next.py`).

A flag is here only when the code says so: after apply it does nothing on 12, or it is refused.
"""

from __future__ import annotations

from typing import NamedTuple

from packaging.specifiers import SpecifierSet


class Advice(NamedTuple):
    """Drop `flag` from a capability-12 launch on `releases` (and at TP > 1 when `above_tp_one`)."""

    flag: str
    why: str  # one short reason, shown beside the launch line
    source: str  # where the fact is measured or read
    releases: SpecifierSet = SpecifierSet()  # empty: every release
    above_tp_one: bool = False  # only when --tp-size is above 1


ADVICE: tuple[Advice, ...] = (
    Advice(
        "--enable-torch-symm-mem",
        "drop --enable-torch-symm-mem: no capability-12 part has NVLink multicast; with the "
        "tables patched SGLang turns the communicator off, so the flag does nothing",
        'README (measured on RTX PRO 6000s, torch 2.11: KeyError: 12 before, "multicast '
        'operations are not supported" after); patch sm120-symm-mem-sizes',
    ),
    Advice(
        "--enable-flashinfer-allreduce-fusion",
        "drop --enable-flashinfer-allreduce-fusion: at TP > 1 on capability 12 it is refused "
        "(FlashInfer's fused all-reduce is built for SM90 and SM100 only)",
        "patch sm120-allreduce-fusion-refusal (0.5.3 - 0.5.7; 0.5.8 - 0.5.13 ignore the flag "
        "on 12, 0.5.14 replaced it)",
        SpecifierSet("<0.5.8"),
        above_tp_one=True,
    ),
)
