"""Which capabilities each backend or kernel family SGLang can select runs on: data, with sources.

The facts live in `data/kernel_support.json`, one record per backend as SGLang's flags spell it
(`--attention-backend fa3`, `--moe-runner-backend flashinfer_trtllm`, ...). Patches prove their
forward fixes against it and doctor judges what a capability-12 GPU is given by it, so a fact is
written once, with where it comes from (the kernel's own arch list or assertion, an upstream
issue) and what it needs beyond the capability (a wheel version, NVLink multicast, shared memory).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import NamedTuple

Capability = tuple[int, int]  # (major, minor), as torch.cuda.get_device_capability() gives it
# attention: --attention-backend; dsa: --nsa-prefill-backend / --nsa-decode-backend (DeepSeek
# sparse attention); moe: --moe-runner-backend; gemm: FP8/FP4 linear kernels; comm: all-reduce.
KINDS = ("attention", "dsa", "moe", "gemm", "comm")


class Span(NamedTuple):
    """Capabilities from `low` to `high` inclusive (`high` None: every later one too)."""

    low: Capability
    high: Capability | None

    def holds(self, capability: Capability) -> bool:
        return self.low <= capability and (self.high is None or capability <= self.high)


class Support(NamedTuple):
    """Where one backend runs, and why we know."""

    kind: str
    name: str
    runs_on: tuple[Span, ...]
    source: str
    needs: str | None = None

    def runs(self, capability: Capability) -> bool:
        return any(span.holds(capability) for span in self.runs_on)

    def shown_range(self) -> str:
        return ", ".join(_shown(s) for s in self.runs_on) or "nothing"


def lookup(kind: str, name: str) -> Support | None:
    """The record for `name` among `kind`'s backends, or None: not in the table, not judged."""
    return table().get((kind, name))


def runs_on(kind: str, name: str, capability: Capability) -> bool | None:
    """Whether `name` runs on `capability`: True, False, or None when the table does not know."""
    record = lookup(kind, name)
    return None if record is None else record.runs(capability)


@functools.cache
def table() -> dict[tuple[str, str], Support]:
    raw = json.loads(resources.files("sglpatch").joinpath("data/kernel_support.json").read_text())
    records: dict[tuple[str, str], Support] = {}
    for entry in raw["backends"]:
        record = Support(
            entry["kind"],
            entry["name"],
            tuple(
                Span(_capability(lo), _capability(hi) if hi else None)
                for lo, hi in entry["runs_on"]
            ),
            entry["source"],
            entry.get("needs"),
        )
        if record.kind not in KINDS or (record.kind, record.name) in records:
            raise ValueError(
                f"kernel_support.json: bad or repeated record {record.kind}/{record.name}"
            )
        records[record.kind, record.name] = record
    return records


def _capability(text: str) -> Capability:
    major, minor = text.split(".")
    return int(major), int(minor)


def _shown(span: Span) -> str:
    low = "%d.%d" % span.low
    if span.high is None:
        return f"{low}+"
    high = "%d.%d" % span.high
    return low if high == low else f"{low}-{high}"
