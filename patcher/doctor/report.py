"""doctor's answer as values: the blockers, the suspects, the models, the kernels and the one-line
answer (`Diagnosis.verdict`). `diagnosis.diagnose` computes it; its docstring says what each part
means. `sglpatch.doctor.diagnose` returns it whole; nothing outside `doctor/` builds or edits one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from sglpatch.doctor import judged
from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.doctor.findings import Finding, Word

if TYPE_CHECKING:
    from sglpatch.doctor.kernels import KernelFinding

# A pending patch's note when the release is outside its tested range: apply refuses it
# without --force, so doctor names --force as apply's refusal does.
UNTESTED = "untested on this release: apply --force"
# The source of a blocker in the environment itself: a requirement of SGLang not installed.
ENVIRONMENT = "the environment"
# The source of a blocker in a compiled package beside SGLang: no patch of sglpatch's fixes it.
KERNELS = "the installed kernels"


class Origin(Word):
    """Where a blocker (or a row beside them) comes from."""

    PATCH = "patch"  # a catalogue patch with work left on the tree (`source`: its id)
    MODEL = "model"  # the model lacks EAGLE-3 methods (`source`: its class)
    GAP = "known gap"  # a known gap no patch fixes (`source`: its id)
    SUSPECT = "suspect"  # a suspect counted under --strict (`source`: file:line)
    ENVIRONMENT = "environment"  # a requirement of SGLang not installed (`source`: ENVIRONMENT)
    KERNELS = "kernels"  # a kernel package without code for 12 (`source`: KERNELS)


class Blocker(NamedTuple):
    what: str  # one line: what breaks
    source: str  # the catalogue patch that knows it, the model, or the suspect's place
    fixed_by: str | None  # the patch `sglpatch apply` runs to fix it
    note: str = ""  # why apply cannot fix it, when it cannot
    when: str = ""  # the condition it breaks under: "with --enable-torch-symm-mem", "if ..."
    origin: Origin = Origin.PATCH
    # The parts it holds for ("12.1": a kernel build, a gap on GB10); (): every part judged.
    parts: tuple[str, ...] = ()

    @property
    def beyond_apply(self) -> bool:
        """In the environment, not the tree: another build or a missing package (`note`: the
        command that fixes it)."""
        return self.origin in (Origin.KERNELS, Origin.ENVIRONMENT)


class Unread(NamedTuple):
    """A file doctor could not read or parse, or a folder it could not list: not judged."""

    file: str  # sglang/...; a folder ends with "/"
    why: str


class ModelReport(NamedTuple):
    name: str
    module: str  # sglang/srt/models/x.py, where the class is defined
    missing: tuple[str, ...]
    fixed_by: str | None


class Launched(NamedTuple):
    """The launch the user gave after `--`, as the release's own options parsed it."""

    model_path: str | None  # its --model-path (or --model, or `sglang serve MODEL`)
    flags: dict[str, object]  # the options given, by their first long spelling -> value
    passed: frozenset[str]  # the patches' `Concerns.flag`s this launch passes
    # The options given, by their ServerArgs field (`tp_size`): what the start-up runs with.
    fields: tuple[tuple[str, object], ...] = ()


class Step(NamedTuple):
    """A line to run next (`Diagnosis.next`), and why."""

    command: str
    why: str


class GpuChoice(NamedTuple):
    """Which capability-12 parts are judged, and who said so."""

    capabilities: tuple[str, ...]  # the parts judged ("12.0", "12.1")
    source: str | None  # "nvidia-smi", "--capability", or None (neither: both parts)
    present: tuple[str, ...] = ()  # what nvidia-smi reported, each part once
    note: str = ""  # e.g. that no GPU present is capability 12


class Suspect(NamedTuple):
    finding: Finding
    covered_by: str | None
    # By the kernel-support table (`judged`): the worst of its judgements, one per capability
    # asked.
    outcome: judged.Outcome = judged.FAILS
    judgements: tuple[judged.Judgement, ...] = ()

    @property
    def opt_in(self) -> str:
        """The user's flag that leads to every listed judgement, or "" (by default)."""
        listed = [j for j in self.judgements if j.outcome is self.outcome]
        return listed[0].opt_in if listed and all(j.opt_in for j in listed) else ""

    @property
    def differs(self) -> bool:
        """12.0 and 12.1 are judged apart here."""
        return len({(j.outcome, j.what.replace(j.capability, "12")) for j in self.judgements}) > 1


# A row's states (`ModelRow.now`, `after_apply`).
RUNS, BREAKS, NOT_EVALUATED, NEEDS = "runs", "breaks", "not evaluated", "needs"


class ModelRow(NamedTuple):
    """One model, checkpoint and part: does it run now, and after `sglpatch apply`
    (`model_rows`)? `now` and `after_apply` are "runs", "breaks", "needs" or "not evaluated"."""

    architecture: str
    quantization: str | None  # as SGLang names it: fp8, modelopt_fp4, mxfp4; None: unquantized
    form: str | None  # "dsa": the DSA form (index_topk set)
    capability: str  # "12.0" or "12.1"
    now: str
    after_apply: str
    patches: tuple[str, ...]  # what apply runs that this row needs
    why: str  # what breaks (or is not evaluated) now; "" when it runs
    file: str | None  # where (sglang/...), when known
    line: int | None


# A tool a row needs -> the package beside SGLang whose kernels check judges it.
_TOOL_OF = {"ptxas": "triton", "nvcc": "flashinfer-python"}


class Diagnosis(NamedTuple):
    release: Version | None
    model: ModelReport | None  # the one --model chose
    blockers: tuple[Blocker, ...]
    suspects: tuple[Suspect, ...]
    refusals: tuple[Finding, ...]  # code that refuses capability 12 with an error, by design
    required: dict[str, tuple[str, ...]]  # EAGLE-3 method -> where the target's code calls it
    models: tuple[ModelReport, ...]  # generation models (all, or those --model chose)
    excluded: dict[str, str]  # registered classes that are no EAGLE-3 target -> why
    strict: bool
    asked: str | None = None  # what --model named
    not_judged: tuple[Unread, ...] = ()  # files not read or parsed, folders not listed
    opt_in: tuple[Blocker, ...] = ()  # with --model: pending patches reached only with a flag
    tables: tuple[Blocker, ...] = ()  # pending patches that only complete a table here
    elsewhere: tuple[str, ...] = ()  # with --model: pending patches about other models (ids)
    quantization: str | None = None  # the checkpoint's, when it is known
    # Suspects the table does not judge (what 12 gets there is unknown to it), and how many
    # decisions give 12 something that runs (counted, not listed).
    unjudged: tuple[Suspect, ...] = ()
    harmless: int = 0
    capabilities: tuple[str, ...] = CAPABILITIES
    # With --model whose module could not be read: pending patches that may concern it (ids).
    undecided: tuple[str, ...] = ()
    # Known gaps no patch fixes that the reading cannot see, said but not counted (known_gaps).
    known: tuple[Blocker, ...] = ()
    # The compiled packages beside SGLang (None: not judged, the target is a checkout), and the
    # site-packages they were read in. Their blockers are in `blockers` (source: `KERNELS`).
    kernels: tuple[KernelFinding, ...] | None = None
    kernels_from: Path | None = None
    # The config.json the model's architecture was read in: --model-path's, or a Hugging Face
    # id's snapshot in the local hub cache (None: --model named the architecture or module).
    model_from: Path | None = None
    # Where `quantization` was read: config.json's key, or "--quantization" (the launch's).
    quantization_from: str = ""
    # Whether EAGLE-3 was asked for (--eagle3, or the launch's --speculative-algorithm EAGLE3):
    # only then are the model's missing EAGLE-3 methods blockers.
    eagle3: bool = False
    # The model asked for is an EAGLE-3 (or other) draft model: its class name.
    draft: str | None = None
    launch: Launched | None = None  # the launch given after `--`
    gpu: GpuChoice | None = None  # which parts were judged, and from what
    # What to run next, in order (`next_steps`): apply, then the launch with the flags that
    # must change on 12 dropped; empty when there is nothing to do.
    next: tuple[Step, ...] = ()
    # One row per model, checkpoint and part judged (--all-models, or the model --model chose);
    # None: not evaluated.
    rows: tuple[ModelRow, ...] | None = None

    @property
    def ready(self) -> bool:
        return not self.blockers and not self.not_judged

    @property
    def needs(self) -> tuple[str, ...]:
        """What the chosen model's rows need beyond `sglpatch apply` and nothing here judged,
        each with its part: "12.1 has a ptxas that knows sm_121a (...)". Only with a model,
        for its checkpoint's quantization when known; not a tool's need where the package that
        runs it beside SGLang was judged for that part (then it is a blocker, or it has it)."""
        if self.rows is None or (self.model is None and not self.asked):
            return ()
        judged = {k.package: k for k in self.kernels or ()}
        found = []
        for row in self.rows:
            if row.after_apply != NEEDS:
                continue
            if self.quantization_from and row.quantization != self.quantization:
                continue
            need = row.why.partition(" needs ")[2] or row.why
            tool = next((t for t in _TOOL_OF if t in need), None)
            package = judged.get(_TOOL_OF[tool]) if tool else None
            if package is not None and package.runs_on.get(row.capability) is not None:
                continue
            found.append(f"{row.capability} has {need}")
        return tuple(dict.fromkeys(found))

    @property
    def per_part(self) -> str:
        """Each part's count where they differ ("12.0: 10, 12.1: 12"), else ""."""
        counts = [
            (part, sum(1 for b in self.blockers if not b.parts or part in b.parts))
            for part in self.capabilities
        ]
        if len({n for _, n in counts}) < 2:
            return ""
        return ", ".join(f"{part}: {n}" for part, n in counts)

    @property
    def apply_command(self) -> str:
        """What fixes the blockers apply can fix: `--force` where their release is untested
        (apply refuses it otherwise)."""
        rows = (*self.blockers, *self.opt_in)
        untested = any(b.fixed_by and UNTESTED in b.note for b in rows)
        return "sglpatch apply --force" if untested else "sglpatch apply"

    @property
    def unread(self) -> str:
        """What is not judged, counted: "1 file", "1 folder and 3 files"."""
        folders = sum(1 for unread in self.not_judged if unread.file.endswith("/"))
        files = len(self.not_judged) - folders
        counted = [
            f"{n} {noun}{'s' * (n != 1)}" for n, noun in ((folders, "folder"), (files, "file"))
        ]
        return " and ".join(c for c in counted if not c.startswith("0 ")) or "0 files"

    @property
    def lacking(self) -> list[ModelReport]:
        return [m for m in self.models if m.missing]

    @property
    def verdict(self) -> str:
        subject = "capability 12"
        if self.model is not None or self.asked:
            name = self.model.name if self.model else self.asked
            subject += f" + EAGLE-3 on {name}" if self.eagle3 else f" with {name}"
        where = f"SGLang {self.release}" if self.release else "SGLang, release unknown"
        unjudged = len(self.not_judged)
        files = self.unread
        if self.ready:
            answer = "ready" + (f" once {'; '.join(self.needs)}" if self.needs else "")
        elif not self.blockers:
            answer = f"cannot tell: {files} could not be read or parsed (not judged)"
        else:
            count = len(self.blockers)
            fixable = sum(1 for b in self.blockers if b.fixed_by)
            noun = "blocker" if count == 1 else "blockers"
            apply = f"`{self.apply_command}`"
            each = self.per_part
            counted = f"{count} {noun}" + (f" ({each})" if each else "")
            if fixable == count:
                answer = f"{counted}, {'both' if count == 2 else 'all'} fixed by {apply}"
                if count == 1:
                    answer = f"{counted}, fixed by {apply}"
            elif fixable:
                answer = f"{counted}, {fixable} fixed by {apply}"
            else:
                answer = f"{counted}, none fixed by `sglpatch apply`"
            if unjudged:
                answer += f"; {files} not judged"
        return f"{subject} ({where}): {answer}"
