"""What the kernels section says: one finding per package, its JSON and its text lines."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sglpatch.doctor.kernels.archs import Code, parse_capability, runs_on, summary


class KernelFinding(NamedTuple):
    """One kernel package: does its code run on each capability, why, and what fixes it.

    `runs_on[cap]` is True (runs), False (does not run) or None (not judged: not installed,
    compiled at run time by code doctor does not judge, or a file that could not be read).
    `required`: SGLang needs this package's code on capability 12, so False there is a
    blocker (`blocks`); a wheel SGLang uses only on other GPUs (flashinfer-cubin's
    capability-10 kernels) is reported the same way but blocks nothing.
    """

    package: str
    version: str | None
    runs_on: Mapping[str, bool | None]
    why: str
    fix: str = ""
    required: bool = False
    details: Mapping[str, object] = {}

    def blocks(self, capability: str) -> bool:
        """Whether this finding keeps SGLang from running on `capability` (no patch fixes it)."""
        return self.required and self.runs_on.get(capability) is False

    def to_json(self) -> dict[str, object]:
        return {
            "package": self.package,
            "version": self.version,
            "runs_on": dict(self.runs_on),
            "why": self.why,
            "fix": self.fix or None,
            "required": self.required,
            **{k: v for k, v in self.details.items() if k not in {"package", "version"}},
        }


def not_judged(
    package: str, version: str | None, capabilities: Sequence[str], why: str, **details: object
) -> KernelFinding:
    return KernelFinding(package, version, dict.fromkeys(capabilities), why, "", False, details)


def judge_codes(codes: Counter[Code], capabilities: Sequence[str]) -> dict[str, bool | None]:
    """CUDA's compatibility rules per capability; None for a capability that is not `M.m`."""
    result: dict[str, bool | None] = {}
    for text in capabilities:
        cap = parse_capability(text)
        result[text] = None if cap is None else any(runs_on(c, cap) for c in codes)
    return result


def explain(codes: Counter[Code], capability: str) -> str:
    """Which of `codes` a device of `capability` runs, or why none does, in a few words."""
    cap = parse_capability(capability)
    if cap is None:
        return f"{capability}: not a capability"

    # Name the most general code that runs (sm_120 over sm_120a): it says most about the build.
    def rank(c: Code) -> tuple[int, bool]:
        return (c.sm, c.variant != "a")

    sass = sorted((c for c in codes if c.kind == "sass" and runs_on(c, cap)), key=rank)
    if sass:
        return f"{capability} runs its {sass[-1].name} SASS"
    ptx = sorted((c for c in codes if c.kind == "ptx" and runs_on(c, cap)), key=rank)
    if ptx:
        return f"{capability} JIT-compiles its {ptx[-1].name} PTX at first use"
    near = sorted(c for c in codes if c.major_minor[0] == cap[0])
    if not near:
        newest = max(codes, key=lambda c: c.sm, default=None)
        tail = f" (newest: {newest.name})" if newest else ""
        return f"{capability}: no code for capability {cap[0]}{tail}"
    reasons = []
    for code in near:
        if code.variant == "a":
            reasons.append(f"{code.name} is arch-specific ({code.sm // 10}.{code.sm % 10} only)")
        else:
            reasons.append(f"{code.name} needs {code.sm // 10}.{code.sm % 10} or later")
    return f"{capability}: " + ", ".join(reasons)


def binary_finding(
    package: str,
    version: str | None,
    label: str,
    codes: Counter[Code],
    capabilities: Sequence[str],
    *,
    fix: str,
    required: bool,
    **details: object,
) -> KernelFinding:
    """A finding for compiled code: `label` names the file(s) read, `fix` applies on failure."""
    verdicts = judge_codes(codes, capabilities)
    parts = [f"{label}: {summary(frozenset(codes))}"]
    parts += [explain(codes, cap) for cap in capabilities if verdicts[cap] is not None]
    archs = {c.name: n for c, n in sorted(codes.items(), key=lambda kv: (kv[0].sm, kv[0].name))}
    failing = any(v is False for v in verdicts.values())
    return KernelFinding(
        package,
        version,
        verdicts,
        "; ".join(parts),
        fix if failing else "",
        required,
        {"archs": archs, **details},
    )


def _word(value: bool | None) -> str:
    return {True: "runs", False: "does not run", None: "not judged"}[value]


def render(findings: Sequence[KernelFinding], capabilities: Sequence[str]) -> list[str]:
    """The human report's kernels section: a heading, then each package in a few lines."""
    lines = ["Kernels (the compiled packages beside SGLang, read without importing them):"]
    for f in findings:
        name = f"{f.package} {f.version}" if f.version else f"{f.package} (not installed)"
        verdicts = ", ".join(f"{cap} {_word(f.runs_on.get(cap))}" for cap in capabilities)
        blocker = [cap for cap in capabilities if f.blocks(cap)]
        mark = f"  [blocker on {', '.join(blocker)}]" if blocker else ""
        lines.append(f"  - {name}: {verdicts}{mark}")
        lines.append(f"      {f.why}")
        if f.fix:
            lines.append(f"      fix: {f.fix}")
    return lines
