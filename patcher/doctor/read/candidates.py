"""Which lines of a module can hold a capability gate, found from its bytes before parsing.

A line holds a capability word (`get_device_capability`, `is_sm100_supported`, `is_blackwell`,
`get_device_sm`, a name with "capability" or `major`) and code that can decide something (a
comparison, an index, an assignment, a call of a helper); then the lines that use a name such
a line assigns from the device (`sm = get_device_sm()` ... `if sm < 90`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from sglpatch.doctor.read import chunks
from sglpatch.doctor.read.source_tree import without_strings


class Starts:
    """Line numbers of byte offsets, counted on demand: most files need a handful."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def lines(self, offsets: Iterator[int]) -> list[int]:
        found = []
        line, previous = 1, 0
        for offset in sorted(offsets):
            line += self.data.count(b"\n", previous, offset)
            previous = offset
            found.append(line)
        return found


# "capability" as a word or a prefix (`capability_int`), not `capabilities` or a class name.
_CAPABILITY = r"(?:apability|APABILITY)(?![A-Za-z])"
_DEVICE_VALUE = re.compile(rf"(?:is_sm\d|blackwell|hopper_with|device_sm\b|{_CAPABILITY})\w*")
_ASSIGNED = re.compile(r"^\s*([A-Za-z_][\w, ()]*?)\s*=(?!=)")


# Each is a pass through the file. `_with_cuda` stands for is_hopper_with_cuda_12_3 and
# is_ampere_with_cuda_12_3 (one pass for the two).
KEYWORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"device_sm", b"_with_cuda",
            b"major", b"get_platform()")  # fmt: skip


def keyword_lines(data: bytes, starts: Starts, lines: Sequence[str]) -> list[int]:
    """Code lines holding a capability word: bytes.find beats one alternation regex by far."""
    offsets = []
    for word in KEYWORDS:
        index = data.find(word)
        while index != -1:
            end = index + len(word)
            if not _whole(data, word, index):  # the next one on this line may be
                index = data.find(word, end)
                continue
            offsets.append(index)
            newline = data.find(b"\n", index)
            if newline == -1:
                break
            index = data.find(word, newline)
    return sorted({n for n in starts.lines(iter(offsets)) if _evaluable(lines[n - 1])})


def hit_lines(hits: Sequence[tuple[int, bytes]]) -> list[int]:
    """`keyword_lines` of a file from the lines `git grep` found holding a keyword (line
    number, line): the same lines, with no pass through the file."""
    return [
        number
        for number, line in hits
        if any(_holds(line, word) for word in KEYWORDS) and _evaluable(_text(line))
    ]


def _text(line: bytes) -> str:
    """git's line as `scanner.lines_of` has it: decoded, without the \\r of a CRLF ending."""
    text = line.decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\r") else text


def _holds(line: bytes, word: bytes) -> bool:
    index = line.find(word)
    while index != -1:
        if _whole(line, word, index):
            return True
        index = line.find(word, index + len(word))
    return False


def _whole(data: bytes, word: bytes, index: int) -> bool:
    """Whether `word` at `index` is the capability word, not part of another."""
    end = index + len(word)
    if word == b"major":
        return not (index and _WORD_BYTE.match(data, index - 1)) and not _WORD_BYTE.match(data, end)
    if word == b"is_sm":
        return data[end : end + 1].isdigit()
    if word == b"device_sm":  # get_device_sm(), get_platform().device_sm; not _count
        return not _WORD_BYTE.match(data, end)
    if word == b"_with_cuda":
        return data.endswith((b"hopper", b"ampere"), 0, index)
    if word in (b"apabilit", b"APABILIT"):
        # capability, CAPABILITY_x: not capabilities, not a class like CapabilityRequirement
        return data[end : end + 1] in (b"y", b"Y") and not data[end + 1 : end + 2].isalpha()
    return True


_WORD_BYTE = re.compile(rb"\w")
_HELPER_WORD = re.compile(r"is_sm\d|blackwell|hopper_with|ampere_with|device_sm\b|get_device_capab")
_OPERATION = re.compile(r"[<>]|[=!]=|\bin\b|\[\s*[01]\s*\]")
_NOT_CODE = ("#", "import ", "from ", "def ", "async def ", "class ", "@")
_LISTED = re.compile(r"[\w.]+,?")  # `get_device_capability,` inside an import list
# `p = get_platform()` too: `p.is_sm100` reads a platform probe through it.
_DEVICE_RHS = re.compile(
    rf"is_sm\d|blackwell|hopper_with|device_sm\b|{_CAPABILITY}|\bmajor\b|get_platform\(\)"
)


def _evaluable(line: str) -> bool:
    """Code that can take part in a gate: a helper call, a comparison or index, or a value
    made from the device.

    Imports, headers, comments and prose that mentions a major version (a docstring, an error
    message), and assignments that only name a capability (`_nvmlNvLinkCapability_t = c_uint`)
    are left unparsed.
    """
    stripped = line.strip()
    if stripped.startswith(_NOT_CODE) or _LISTED.fullmatch(stripped):
        return False
    line = without_strings(line)  # `"needs capability >= 80"` decides nothing
    assigned = _ASSIGNED.match(line)
    if assigned and not _OPERATION.search(line, assigned.end()):
        return _DEVICE_RHS.search(line, assigned.end()) is not None
    return _HELPER_WORD.search(line) is not None or _OPERATION.search(line) is not None


def _code_lines(offsets: Iterator[int], starts: Starts, lines: Sequence[str]) -> list[int]:
    """The lines of these offsets, comments left out."""
    found = sorted(set(starts.lines(offsets)))
    return [n for n in found if not lines[n - 1].lstrip().startswith("#")]


def _uses(data: bytes, names: set[str]) -> Iterator[int]:
    """Offsets of each name as a whole word (bytes.find: a `\\b(?:a|b)\\b` regex has no
    literal to skip ahead by, and crawls)."""
    for name in names:
        word = name.encode()
        index = data.find(word)
        while index != -1:
            end = index + len(word)
            if not (index and _WORD_BYTE.match(data, index - 1)) and not _WORD_BYTE.match(
                data, end
            ):
                yield index
            index = data.find(word, end)


def with_aliases(
    source_lines: Sequence[str], data: bytes, starts: Starts, lines: list[int]
) -> list[int]:
    """Add the lines that use a name assigned on a candidate line (`sm = get_device_sm()`), the
    lines that hand a local chosen there on (`_sinks`), and the KV dtype's arms (`_kv_arms`)."""
    found = set(lines)
    done: set[str] = set()
    new = list(lines)
    for _ in range(2):
        names: set[str] = set()
        for line in new:
            text_line = source_lines[line - 1] if line <= len(source_lines) else ""
            match = _ASSIGNED.match(text_line)
            if match and _made_from_device(without_strings(text_line[match.end() :])):
                names |= {n.strip(" ()") for n in match.group(1).split(",")}
        # `_` and one-letter names are everywhere: following them would parse whole modules.
        names = {n for n in names if n.isidentifier() and len(n) > 1} - done
        if not names:
            break
        done |= names
        new = [n for n in _code_lines(_uses(data, names), starts, source_lines) if n not in found]
        found |= set(new)
    return sorted(found | _sinks(source_lines, data, starts, lines) | _kv_arms(source_lines, lines))


# `default = "trtllm" if major >= 10 else "flashmla_kv"`: a local chosen by a test on one line.
_CHOSEN_BY_TEST = re.compile(r"^\s*([A-Za-z_]\w+)\s*=(?!=)(.*\bif\b.*\belse\b.*)$")
_SINK_REACH = 40  # lines after the choice where its function hands it on (0.5.23: 2 and 4)


def _sinks(source_lines: Sequence[str], data: bytes, starts: Starts, lines: list[int]) -> set[int]:
    """The lines that hand such a local on, whole, to something else (`declared[
    "dsa_prefill_backend"] = default`): the flag it chooses is named there."""
    found: set[int] = set()
    for line in lines:
        text = source_lines[line - 1] if line <= len(source_lines) else ""
        match = _CHOSEN_BY_TEST.match(text)
        if match is None:
            continue
        name = match.group(1)
        sink = re.compile(rf"^\s*[^=#]+=\s*{name}\s*(#.*)?$")
        for number in _code_lines(_uses(data, {name}), starts, source_lines):
            if line < number <= line + _SINK_REACH and sink.match(source_lines[number - 1]):
                found.add(number)
    return found


def _made_from_device(value: str) -> bool:
    """Only a value made from the device (`sm = get_device_sm()`, `cap[0]`) makes an alias; a
    device word passed on as an argument (pynvml's `ret = fn(device, capability)`), inside a
    type's name (`_nvmlDeviceVgpuCapability_t(...)`) or in a comment does not."""
    value = value.split("#", 1)[0]
    for match in _DEVICE_VALUE.finditer(value):
        start = match.start()
        if start > 1 and value[start - 1] == "C" and value[start - 2].islower():
            continue  # CamelCase: a type
        if not value[match.end() :].lstrip().startswith((",", ")")):
            return True
    return False


def naming_new(data: bytes, starts: Starts, helpers: Sequence[str]) -> list[int]:
    """Lines that may name capability 12 itself (`== 12`, `>= 120`, `is_sm120_supported()`):
    a function holding one has thought about 12, so the parse keeps them beside the gates."""
    offsets = [match.start() for match in _TWELVE.finditer(data)]
    # `is_sm12` finds is_sm120_supported and get_platform().is_sm120 alike: a pass for it,
    # and one for each other helper true on 12 alone.
    for name in ("is_sm12", *(h for h in helpers if "is_sm12" not in h)):
        word = name.encode()
        index = data.find(word)
        while index != -1:
            offsets.append(index)
            index = data.find(word, index + len(word))
    return sorted(set(starts.lines(iter(offsets))))


# `12` or a three-digit `12x` as a number of its own (not `0.12`, `1200`, `sm_120a`). The literal
# comes first: the regex engine skips ahead to each `12`, where a loop over them in Python crawled.
_TWELVE = re.compile(rb"12(?<![\w.]12)\d?(?![\w.])")


# `self.kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"` (0.5.7 - 0.5.23, DSA): the
# dtype then chooses backends in arms that test no GPU (`if kv_cache_dtype == "fp8_e4m3":`).
_KV_ARM = re.compile(r"^(\s*)(?:el)?if\s.*kv_cache_dtype\s*==\s*[\"']")
_ARM_LINES = 30  # an arm's body kept at most (0.5.7 - 0.5.23: 4 - 12 lines)


def _kv_arms(source_lines: Sequence[str], lines: list[int]) -> set[int]:
    """Where a candidate line chooses the KV cache dtype (a conditional expression, or an `if`
    whose next line sets it: 0.5.10 - 0.5.14), the lines that set it to a literal and the arms
    that test it for a value, with their bodies: `reach` follows the dtype into them."""
    chooses = any(
        (
            _CHOICE.search(source_lines[n - 1])
            and "kv_cache_dtype" in " ".join(source_lines[max(n - 2, 0) : n])
        )
        or (n < len(source_lines) and _KV_SET.match(source_lines[n]))
        for n in lines
        if n <= len(source_lines)
    )
    if not chooses:
        return set()
    found: set[int] = set()
    for number, text in enumerate(source_lines, 1):
        if "kv_cache_dtype" not in text:
            continue
        if _KV_SET.match(text):
            found.add(number)
        match = _KV_ARM.match(text)
        if match is None:
            continue
        last = chunks.block_end(source_lines, number - 1, len(match.group(1))) + 1
        found.update(range(number, min(last, number + _ARM_LINES) + 1))
    return found


_CHOICE = re.compile(r"\bif\b.*\belse\b")
_KV_SET = re.compile(r"^\s*[\w.]*kv_cache_dtype\s*=\s*[\"'][\w]+[\"']\s*(#.*)?$")
