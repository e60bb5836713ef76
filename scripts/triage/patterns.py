"""Which changed line of SGLang matters at capability 12: one that names 12 (NAMES, DEVICES, ARCH,
a capability word next to a 12), or a gate that lets 12 in without naming it (GATES), and which
names are code built for SM100 only (by the kernel-support table, per release)."""

from __future__ import annotations

import functools
import re

# What counts as "mentions capability 12". Each pattern is searched in one changed line.
# Names: sm120 / sm_120 / SM121 / sm12x / is_sm120_supported / Sm120 / "SM 12.0".
NAMES = re.compile(r"(?i)sm_?12[01x]|\bsm\s?12\.[01x]\b")
# Device names of the capability-12 parts (RTX PRO 6000 / RTX 50xx = 12.0, GB10 / Spark = 12.1).
DEVICES = re.compile(r"(?i)rtx[ _-]?pro[ _-]?6000|rtx[ _-]?50[5-9]0|\bgb10\b|dgx[ _-]?spark")
# Arch strings: "12.0a", "120a", "12.1f", "sm_120a" (the last one already in NAMES).
ARCH = re.compile(r"""["'](12\.[01][af]?|12[01][af]?)["']|\b12[01][af]\b""")
# Numbers that are capability 12 only next to a capability word on the same line:
# `major == 12`, `get_device_sm() == 120`, `>= 120`, `(12, 0)`, `(120, 121)`, `in [10, 12]`.
CAPABILITY_WORD = re.compile(
    r"(?i)major|minor|capabilit|\barch\b|arch\b|_arch|\bsm\b|_sm\b|\bsm_|device_sm|\bcc\b"
)
CAPABILITY_NUMBER = re.compile(
    r"(==|!=|>=|<=|<|>)\s*\(?\s*12[01]?\b(?!\.\d)"  # == 12, >= 120, == (12, 0)
    r"|\b12[01]?\s*(==|!=|<=|>=)"  # 12 == major
    r"|[\[(]\s*(\d{1,3}\s*,\s*)*12[01]?\s*(,\s*\d{1,3}\s*)*[\])]"  # (12, 0), [10, 12], (120, 121)
)
# CUDA toolkit versions look the same (`CUDA_VERSION.major == 12`, `cuda >= (12, 0)`).
CUDA_VERSION = re.compile(r"(?i)cuda_?version|version\.cuda|cuda\s*>=|cuda_major|nvcc|toolkit")

# Gates that include capability 12 without naming it (issue 19). Each family is one named
# pattern, searched in one changed line of code (a comment line is no gate); `branch` also reads
# the file around the line. A hunk is listed when a changed line matches a family and has no
# twin on the other side of the release's diff, as for the names of 12 above.
GATES: dict[str, re.Pattern[str]] = {
    # `is_blackwell()`, `is_blackwell_supported()`, `get_platform().is_blackwell`: true on 10, 11
    # and 12 from 0.5.4.post2, so 12 takes whatever the branch picks.
    "blackwell": re.compile(r"\bis_blackwell\w*"),
    # `is_sm100_supported()`, `is_sm103`, `get_platform().is_sm90`, `is_hopper()`: they exclude
    # 12, so a change to one matters when it moves an SM100-only name (below) onto or off 12.
    "sm100-sm90": re.compile(r"\bis_sm(?:100|103|10x|90)\w*|\bis_hopper\w*"),
    # A capability word (GATE_WORD) next to a lower bound of 8 to 11 (it lets 12 in), or next
    # to a test of 9 or 10 (`==`, `!=`, `<`, `in`: the branch or its `else` decides for 12):
    # `major >= 10`, `major == 10`, `device_sm >= 100`, `get_device_sm() >= 100`,
    # `get_device_capability()[0] >= 10`, `sm_version >= 90`, `capability >= (10, 0)`,
    # `get_device_sm() not in (100, 103)`.
    "capability-10": re.compile(
        r"(>=|>)\s*\(?\s*(8|9|10|11|[89]\d|1[01]\d)\b(?!\.\d)"
        r"|(==|!=|<=|<)\s*\(?\s*(9|10|9\d|10\d)\b(?!\.\d)"
        r"|\b(9|10|90|100|103)\s*(==|!=|<=|>=)"
        r"|\bin\s*[\[({]\s*(\d{1,3}\s*,\s*)*(10|100|103)\s*[,\])}]"
    ),
}
# CAPABILITY_WORD without `minor` (`0 <= minor < 10` is no gate).
GATE_WORD = re.compile(
    r"(?i)major|capabilit|\barch\b|arch\b|_arch|\bsm\b|_sm\b|\bsm_|device_sm|\bcc\b"
)
# Names of code built for SM100 that the kernel-support table has no record of (trtllm-gen
# FMHA/MLA/MoE cubins and TRT-LLM comm kernels by any name, CUTLASS SM100 MLA, DeepGEMM spelled
# either way, FlashMLA, tcgen05/TMEM kernels, FP4 GEMM runners, MNNVL, CuTe DSL). The table's
# own records are added per release (`sm100_names`). `blackwell` and `sm100-sm90` lines count
# only in a hunk that names one of them.
SM100_FAMILIES = (
    r"trt_?llm|tllm|cutlass_mla|deep_?gemm|flash_?mla|fp4_gemm|mm_fp4|tcgen05|\btmem\b"
    r"|mnnvl|cutedsl|cute_dsl"
)


@functools.cache
def sm100_names(release: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(SM100 code, code that runs on 12) by the kernel-support table's reading for `release`.

    SM100 code: a record that runs on 10.0 and, on a capability-12 part, does not or runs other
    kernels under its name (`fa4`: SGLang's SM120 port from 0.5.18; `trtllm_mha`: XQA from
    0.5.10), with `SM100_FAMILIES`. Code that runs on 12: a record that runs its own kernels on
    every capability-12 part; its name is cut from a line first, so no family word inside it
    counts. GEMM records are named by their flag's value (`fp8:deep_gemm` is `deep_gemm`).
    """
    from sglpatch.doctor.facts import gpus, kernel_support

    sm100: set[str] = set()
    on_12: set[str] = set()
    for kind, name in kernel_support.table():
        record = kernel_support.lookup(kind, name, release)
        if record is None:
            continue
        value = name.partition(":")[2] or name
        parts = [gpu.capability for gpu in gpus.ASKED]
        if all(record.judge(c) and not record.ported(c) for c in parts):
            on_12.add(value)
        elif record.runs(gpus.B200.capability) and any(
            record.judge(c) is False or record.ported(c) for c in parts
        ):
            sm100.add(value)
    on_12 -= sm100  # a value two flags share (fp4: and fp8:) counts as SM100 code if either is

    def words(names: set[str]) -> str:
        return "|".join(sorted(map(re.escape, names), key=lambda n: (-len(n), n)))

    return (
        re.compile(rf"(?i)\b(?:{words(sm100)})\b|{SM100_FAMILIES}"),
        re.compile(rf"(?i)\b(?:{words(on_12)})(?:_backend)?\b"),
    )


def names_sm100_only(line: str, release: str) -> bool:
    """Whether `line` names code built for SM100, on `release`, by the table and the families."""
    sm100, on_12 = sm100_names(release)
    return sm100.search(on_12.sub(" ", line)) is not None


def mentions_capability_12(line: str) -> bool:
    """True if one source line names capability 12 (see the patterns above)."""
    if NAMES.search(line) or DEVICES.search(line) or ARCH.search(line):
        return True
    return bool(
        CAPABILITY_WORD.search(line)
        and CAPABILITY_NUMBER.search(line)
        and not CUDA_VERSION.search(line)
    )


def gate_families(line: str) -> set[str]:
    """The families of GATES one line of code matches (a comment line matches none)."""
    code = line.split("#", 1)[0]
    if not code.strip():
        return set()
    found = {
        name for name, pattern in GATES.items() if name != "capability-10" and pattern.search(code)
    }
    if (
        GATES["capability-10"].search(code)
        and GATE_WORD.search(code)
        and not CUDA_VERSION.search(code)
    ):
        found.add("capability-10")
    return found
