"""Which capabilities each backend or kernel family SGLang can select runs on: data, with sources.

The facts live in `kernel_support.json` beside this module, one record per backend as SGLang's
flags spell it (`--attention-backend fa3`, `--moe-runner-backend flashinfer_trtllm`, ...).
Patches prove their forward fixes against it and doctor judges what a capability-12 GPU is given
by it, so a fact is written once, with where it comes from (the kernel's own arch list or
assertion, an upstream issue) and what it needs beyond the capability (a wheel version, NVLink
multicast, shared memory).

GEMM records are named by flag: `fp8:<--fp8-gemm-backend value>`, `fp4:<--fp4-gemm-backend
value>` (the two flags share values such as `flashinfer_trtllm`); `gemm_name` spells them.

Three answers, never a guess: True (runs), False (does not), None (not in the table, on its
`not_judged` list, or a capability the record marks `unknown_on`). Where a fact changed between
releases, a record's `earlier` entries say how it held for older ones (a PEP 440 specifier of
SGLang releases); `lookup(..., release=...)` picks the one that holds, the record itself (the
newest reading) otherwise.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any, NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglpatch.doctor.facts.gpus import Capability

# attention: --attention-backend; dsa: --nsa-prefill-backend / --nsa-decode-backend (DeepSeek
# sparse attention; --dsa-* from 0.5.13); moe: --moe-runner-backend; gemm: FP8/FP4 linear kernels
# ("fp8:" / "fp4:" + the flag's value); comm: all-reduce paths.
KINDS = ("attention", "dsa", "moe", "gemm", "comm")
GEMM_FLAGS = {"fp8": "--fp8-gemm-backend", "fp4": "--fp4-gemm-backend"}


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
    # Capabilities where the fact is not established: `judge` answers None there.
    unknown_on: tuple[Span, ...] = ()
    # The SGLang releases this reading holds for; None: the record's own (newest) reading.
    sglang: str | None = None
    # Capabilities where the backend runs other kernels than on 10.x under the same name (a
    # port): it runs there, but whether it serves a given model's features is not established.
    other_kernel_on: tuple[Span, ...] = ()
    other_kernel: str | None = None  # what it runs there instead

    def runs(self, capability: Capability) -> bool:
        return any(span.holds(capability) for span in self.runs_on)

    def judge(self, capability: Capability) -> bool | None:
        """True or False, or None where the record says the fact is unknown."""
        if any(span.holds(capability) for span in self.unknown_on):
            return None
        return self.runs(capability)

    def ported(self, capability: Capability) -> bool:
        """Whether it runs other kernels on `capability` than on 10.x (`other_kernel`)."""
        return any(span.holds(capability) for span in self.other_kernel_on)

    def needs_on(self, capability: Capability) -> list[str]:
        """What `needs` says one installs for this part to run it: its "12.1: a ..." and
        "12.x: a ..." clauses (a ptxas, a DeepGEMM build), not its limits ("12.x: no ...")."""
        if not self.needs:
            return []
        parts = {f"{capability[0]}.{capability[1]}", f"{capability[0]}.x"}
        found = []
        for clause in _clauses(self.needs):
            part, _, rest = clause.partition(": ")
            if part in parts and rest.startswith(("a ", "an ")):
                found.append(rest)
        return found

    def shown_range(self) -> str:
        return ", ".join(_shown(s) for s in self.runs_on) or "nothing"


def _clauses(text: str) -> list[str]:
    """`text` split at its "; " outside parentheses: "12.1: a ptxas (CUDA 12.9+; Triton 3.5.1
    bundles 12.8)" is one clause, not two."""
    found, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith("; ", index):
            found.append(text[start:index])
            start = index + 2
    return [*found, text[start:]]


def gemm_name(flag: str, value: str) -> str:
    """The record name of a GEMM backend: `gemm_name("fp8", "cutlass")` is "fp8:cutlass"."""
    if flag not in GEMM_FLAGS:
        raise ValueError(f"unknown GEMM flag {flag!r} (one of {', '.join(GEMM_FLAGS)})")
    return f"{flag}:{value}"


def lookup(kind: str, name: str, release: str | None = None) -> Support | None:
    """The record for `name` among `kind`'s backends, or None: not in the table, not judged.

    With `release` (an SGLang version), the reading that holds for that release.
    """
    found = _variants().get((kind, name))
    if found is None:
        return None
    if release is not None:
        version = Version(release)
        for variant in found[:-1]:
            if variant.sglang is not None and version in SpecifierSet(variant.sglang):
                return variant
    return found[-1]


def runs_on(
    kind: str, name: str, capability: Capability, release: str | None = None
) -> bool | None:
    """Whether `name` runs on `capability`: True, False, or None when the table does not know."""
    record = lookup(kind, name, release)
    return None if record is None else record.judge(capability)


def variants(kind: str, name: str) -> tuple[Support, ...]:
    """Every reading of one record: its `earlier` ones in order, then its own (newest) last."""
    return _variants().get((kind, name), ())


@functools.cache
def table() -> dict[tuple[str, str], Support]:
    """Every record's own (newest) reading, keyed by (kind, name)."""
    return {key: found[-1] for key, found in _variants().items()}


@functools.cache
def not_judged() -> dict[tuple[str, str], str]:
    """Choices a release offers that the table does not judge, with the reason."""
    judged = _variants()
    reasons: dict[tuple[str, str], str] = {}
    for entry in _raw()["not_judged"]:
        key = (entry["kind"], entry["name"])
        if entry["kind"] not in KINDS or key in reasons or key in judged or not entry["reason"]:
            raise ValueError(f"kernel_support.json: bad or repeated not_judged {key[0]}/{key[1]}")
        reasons[key] = entry["reason"]
    return reasons


@functools.cache
def _raw() -> dict[str, Any]:
    text = resources.files("sglpatch.doctor.facts").joinpath("kernel_support.json").read_text()
    raw: dict[str, Any] = json.loads(text)
    return raw


@functools.cache
def _variants() -> dict[tuple[str, str], tuple[Support, ...]]:
    records: dict[tuple[str, str], tuple[Support, ...]] = {}
    for entry in _raw()["backends"]:
        kind, name = entry["kind"], entry["name"]
        if kind not in KINDS or (kind, name) in records:
            raise ValueError(f"kernel_support.json: bad or repeated record {kind}/{name}")
        if kind == "gemm" and name.partition(":")[0] not in GEMM_FLAGS:
            raise ValueError(f"kernel_support.json: gemm record {name} names no flag (fp8:, fp4:)")
        earlier = [_support(kind, name, {**entry, **old}, old) for old in entry.get("earlier", ())]
        records[kind, name] = (*earlier, _support(kind, name, entry, None))
    return records


def _support(kind: str, name: str, entry: dict[str, Any], old: dict[str, Any] | None) -> Support:
    """One reading; an `earlier` entry (`old`) inherits only what it does not say itself."""
    where = f"kernel_support.json: {kind}/{name}"
    if old is not None:
        entry = {
            **entry,
            "unknown_on": old.get("unknown_on", []),
            "needs": old.get("needs"),
            "other_kernel_on": old.get("other_kernel_on", []),
            "other_kernel": old.get("other_kernel"),
        }
        try:
            SpecifierSet(old["sglang"])
        except (KeyError, InvalidSpecifier) as error:
            raise ValueError(f"{where}: an earlier reading needs a valid 'sglang'") from error
    if not entry.get("source"):
        raise ValueError(f"{where}: no source")
    record = Support(
        kind,
        name,
        _spans(entry["runs_on"], where),
        entry["source"],
        entry.get("needs"),
        _spans(entry.get("unknown_on", []), where),
        None if old is None else old["sglang"],
        _spans(entry.get("other_kernel_on", []), where),
        entry.get("other_kernel"),
    )
    for unknown in record.unknown_on:
        if any(_overlap(unknown, span) for span in record.runs_on):
            raise ValueError(f"{where}: {_shown(unknown)} is both in runs_on and unknown_on")
    if bool(record.other_kernel_on) != bool(record.other_kernel):
        raise ValueError(f"{where}: other_kernel_on and other_kernel go together")
    for ported in record.other_kernel_on:
        inside = (ported.low, ported.high or ported.low)
        if not all(any(s.holds(c) for s in record.runs_on) for c in inside):
            raise ValueError(f"{where}: other_kernel_on {_shown(ported)} is not in runs_on")
    return record


def _spans(raw: list[list[str | None]], where: str) -> tuple[Span, ...]:
    spans: list[Span] = []
    for low, high in raw:
        if low is None:
            raise ValueError(f"{where}: a span needs a low capability")
        span = Span(_capability(low), _capability(high) if high else None)
        if span.high is not None and span.high < span.low:
            raise ValueError(f"{where}: span {low}-{high} runs backwards")
        if spans and (spans[-1].high is None or spans[-1].high >= span.low):
            raise ValueError(f"{where}: spans out of order or overlapping at {low}")
        spans.append(span)
    return tuple(spans)


def _overlap(a: Span, b: Span) -> bool:
    return (b.high is None or a.low <= b.high) and (a.high is None or b.low <= a.high)


def _capability(text: str) -> Capability:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError as error:
        raise ValueError(f"kernel_support.json: bad capability {text!r}") from error


def _shown(span: Span) -> str:
    low = "{}.{}".format(*span.low)
    if span.high is None:
        return f"{low}+"
    high = "{}.{}".format(*span.high)
    return low if high == low else f"{low}-{high}"


__all__ = [
    "GEMM_FLAGS",
    "KINDS",
    "Capability",
    "Span",
    "Support",
    "gemm_name",
    "lookup",
    "not_judged",
    "runs_on",
    "table",
    "variants",
]
