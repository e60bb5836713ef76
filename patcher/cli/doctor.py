"""`sglpatch doctor`: will this SGLang run on capability-12 GPUs, with EAGLE-3 on a model?"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from sglpatch import api
from sglpatch.cli import as_json
from sglpatch.cli.app import app
from sglpatch.cli.errors import handled
from sglpatch.cli.options import (
    CatalogOption,
    DeprecatedVersionOption,
    JsonOption,
    ReleaseOption,
    TargetOption,
    release_asked,
)
from sglpatch.cli.output import emit, release_note, suggest
from sglpatch.cli.usage import examples
from sglpatch.errors import ExitCode

if TYPE_CHECKING:  # doctor's scanners load only when doctor runs
    from sglpatch.doctor import Blocker, Diagnosis, Suspect


# typer needs Optional[...] at run time on Python 3.10 for these annotations.
ModelOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--model",
        "-m",
        help="The model to run with EAGLE-3: its architecture from config.json "
        "(KimiK25ForConditionalGeneration), its models module (kimi_k25), or its Hugging "
        "Face id (moonshotai/Kimi-K2.5), read in the local Hugging Face cache "
        "($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub); nothing is downloaded.",
        show_default=False,
    ),
]
ModelPathOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--model-path",
        help="A checkpoint folder whose config.json names the architecture, or, when no "
        "such folder exists, a Hugging Face id (ORG/NAME) read in the local cache.",
        show_default=False,
    ),
]
StrictOption = Annotated[bool, typer.Option("--strict", help="Count every suspect as a blocker.")]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="List every suspect, refusal, installed kernel and patch about other models.",
    ),
]
CapabilityOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--capability",
        help="Judge one capability-12 part: 12.0 (RTX PRO 6000, RTX 5090) or 12.1 (GB10, "
        "DGX Spark). Default: the parts nvidia-smi reports; where it does not answer (or "
        "reports no part of 12), both, side by side where they differ.",
        show_default=False,
    ),
]

Eagle3Option = Annotated[
    bool,
    typer.Option(
        "--eagle3",
        help="Judge EAGLE-3 on the model without a launch (a launch says it itself: "
        "--speculative-algorithm EAGLE3). Otherwise its missing EAGLE-3 methods are not counted.",
    ),
]
AllModelsOption = Annotated[
    bool,
    typer.Option(
        "--all-models",
        help="Also judge every architecture the release serves, in its usual checkpoints "
        "(bf16, fp8, modelopt_fp4, mxfp4 where the release names it, the DSA form), on each "
        "part: a table of runs / apply / breaks / not evaluated.",
    ),
]
LaunchArgument = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(
        help="After --: the launch you will run, its arguments to `python -m "
        "sglang.launch_server` or the whole command; parsed with the release's own options. "
        "Its --model-path names the model.",
        show_default=False,
        metavar="[-- LAUNCH...]",
    ),
]


# Whether doctor ran in this process (see `freeze_if_ran`).
_ran = False


@app.command(
    epilog=examples(
        "sglpatch doctor --model moonshotai/Kimi-K2.5",
        "sglpatch doctor -- --model-path moonshotai/Kimi-K2.5 --speculative-algorithm EAGLE3",
    )
)
@handled
def doctor(
    target: TargetOption = None,
    model: ModelOption = None,
    model_path: ModelPathOption = None,
    strict: StrictOption = False,
    verbose: VerboseOption = False,
    capability: CapabilityOption = None,
    release: ReleaseOption = None,
    catalog: CatalogOption = None,
    json_out: JsonOption = False,
    old_version: DeprecatedVersionOption = None,
    eagle3: Eagle3Option = False,
    all_models: AllModelsOption = False,
    launch: LaunchArgument = None,
) -> None:
    """Will this SGLang run on capability-12 GPUs, with your model and launch? Read from its source.

    After --, the launch you will run (its flags decide which opt-in patches block; its
    --speculative-algorithm EAGLE3 judges EAGLE-3). Exit 0 when ready, 5 when blockers remain
    (known breakage: a catalogue patch not applied yet, or, with EAGLE-3 asked, the model's
    missing EAGLE-3 methods) or a file could not be read or parsed (not judged).
    Suspects (heuristic findings) block only with --strict. A release that cannot be read is
    exit 2 unless --release gives it.
    """
    version = release_asked(release, old_version)
    global _ran  # what `freeze_if_ran` asks at the process's exit
    _ran = True
    progress = _progress if _stderr_is_terminal() else None
    report = api.diagnose(
        target,
        model,
        catalog,
        model_path=model_path,
        strict=strict,
        progress=progress,
        version=version,
        capability=capability,
        launch=launch,
        eagle3=eagle3,
        apply_line=suggest("apply", target=target, release=version, catalog=catalog),
        all_models=all_models,
    )
    if progress is not None:
        sys.stderr.write("\r\033[K")  # clear the progress line
    if json_out:
        emit(as_json.doctor(report))
    else:
        _print_diagnosis(report, verbose)
        rows = report.diagnosis.rows
        if rows is not None and (all_models or verbose):
            from sglpatch.cli import model_table

            model_table.print_table(rows, report.diagnosis.capabilities, _release(report))
    if not report.diagnosis.ready:
        raise typer.Exit(ExitCode.GAPS)


def _release(report: api.DoctorReport) -> str:
    release = report.diagnosis.release
    return str(release) if release is not None else "(release unknown)"


def freeze_if_ran() -> None:
    """At the exit of sglpatch's own process (`sglpatch.cli.main`), once doctor ran there: what
    is left alive stays out of the collector's last passes (tearing the modules' cycles down
    one by one took 20 ms, twice the rest of the exit); files are still flushed and closed. An
    in-process run (a test's CliRunner) leaves the collector as it was."""
    if _ran:
        gc.freeze()


def _stderr_is_terminal() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()  # None: started with stderr closed


def _progress(stage: str) -> None:
    """One overwritten status line on a terminal's stderr; nothing when stderr is not one."""
    sys.stderr.write(f"\r\033[Kdoctor: {stage}...")
    sys.stderr.flush()


def _print_diagnosis(report: api.DoctorReport, verbose: bool = False) -> None:
    """The verdict, what blocks and what to run; counts for the rest (`verbose`: the lists)."""
    found = report.diagnosis
    typer.echo(found.verdict)
    typer.echo(f"  target: {report.target.root}")
    note = release_note(report.target)
    if note is not None:  # judged as the release it follows: say so, and from what
        typer.echo(f"  judged as {note}")
    if report.model_from is not None:
        typer.echo(f"  config: {report.model_from}")
    if found.quantization is not None:
        typer.echo(f"  quantization: {found.quantization} ({found.quantization_from})")
    _print_given(found)
    if found.blockers:
        typer.echo("\nBlockers:")
        _print_rows(found.blockers)
    if found.opt_in:
        flags = sorted({b.when for b in found.opt_in})
        typer.echo(f"\nNot blockers: only {' or '.join(flags)}:")
        _print_rows(found.opt_in, conditions=False)
    if found.tables:
        typer.echo("\nNot blockers: complete a table only (the run is the same without them):")
        typer.echo(f"  {', '.join(b.source for b in found.tables)}")
    if found.elsewhere:
        count = len(found.elsewhere)
        subject = found.model.name if found.model else found.asked
        named = f": {', '.join(found.elsewhere)}" if verbose else " (--verbose names them)"
        typer.echo(
            f"\nNot about {subject}: {count} pending patch{'es' * (count > 1)} for other models"
            + (" or quantizations" if found.quantization else "")
            + named
        )
    if found.undecided:
        count = len(found.undecided)
        typer.echo(
            f"\nNot judged for {found.asked} (its module could not be read): {count} pending "
            f"patch{'es' * (count > 1)} that may concern it: {', '.join(found.undecided)}"
        )
    if found.known:
        typer.echo("\nKnown, not counted here (`sglpatch apply` cannot fix these):")
        _print_rows(found.known)
    _print_eagle3(found)
    _print_suspects(found, verbose)
    _print_kernels(report, verbose)
    if found.not_judged:
        typer.echo(f"\nNot judged (could not be read or parsed): {found.unread}")
        for file, why in found.not_judged:
            typer.echo(f"  {file}: {why}")
    _print_next(found)


def _print_rows(rows: tuple[Blocker, ...], conditions: bool = True) -> None:
    for blocker in rows:
        fix = f"fixed by `sglpatch apply` ({blocker.fixed_by})" if blocker.fixed_by else ""
        fix = fix or f"no patch yet ({blocker.source})"
        note = f"; {blocker.note}" if blocker.note else ""
        if blocker.beyond_apply:  # another build, a missing package
            fix, note = "`sglpatch apply` cannot fix it", f"; fix: {blocker.note}"
        when = f" ({blocker.when})" if blocker.when and conditions else ""
        when += f" (on {' and '.join(blocker.parts)} only)" if blocker.parts else ""
        typer.echo(f"  - {blocker.what}{when}\n      {fix}{note}")


def _print_given(found: Diagnosis) -> None:
    """Which GPU was judged and why; the launch's options, when one was given."""
    gpu = found.gpu
    if gpu is not None and gpu.source is not None:
        typer.echo(f"  GPU: {', '.join(gpu.capabilities)} (from {gpu.source})")
    elif gpu is not None and gpu.note:
        typer.echo(f"  GPU: {gpu.note}")
    if found.launch is not None:
        flags = [f for f in found.launch.flags if f != "--model-path"]
        beside = " beside --model-path" if found.launch.model_path is not None else ""
        typer.echo(f"  launch: {len(flags)} option{'s' * (len(flags) != 1)} given{beside}"
                   f"{': ' if flags else ''}{' '.join(flags)}")  # fmt: skip


def _print_eagle3(found: Diagnosis) -> None:
    unread = [f for f, _ in found.not_judged if f.startswith("sglang/srt/models/")]
    if found.draft is not None:
        typer.echo(
            f"\nEAGLE-3: {found.draft} is an EAGLE-3 draft model; check its target "
            "(`sglpatch doctor --model TARGET --eagle3`)."
        )
    elif found.model is not None:
        model = found.model
        state = f"lacks {', '.join(model.missing)}" if model.missing else "has them all"
        if model.missing and model.fixed_by and not found.eagle3:  # not among the blockers
            state += f" (fixed by `sglpatch apply`: {model.fixed_by})"
        asked = "" if found.eagle3 else " (not asked, not counted: --eagle3 or a launch with "
        asked = asked and asked + "--speculative-algorithm EAGLE3 judges it)"
        typer.echo(f"\nEAGLE-3 on {model.name} ({model.module}): {state}{asked}")
    elif found.asked is not None and unread:
        typer.echo(f"\nEAGLE-3 on {found.asked}: not judged ({', '.join(unread)} not read)")
    else:
        lacking = found.lacking
        typer.echo(
            f"\nEAGLE-3: {len(lacking)} of {len(found.models)} generation models lack some of "
            f"{', '.join(found.required) or '(nothing required)'}; {len(found.excluded)} other "
            "registered classes are no EAGLE-3 target. Pass --model to check yours."
        )


def _print_next(found: Diagnosis) -> None:
    """What to run, in order (`Diagnosis.next`), each with why; nothing when nothing is to do."""
    if found.next:
        typer.echo("\nNext:")
    for step in found.next:
        typer.echo(f"  {step.command}\n      ({step.why})")


def _print_suspects(found: Diagnosis, verbose: bool) -> None:
    """The gates where what 12 gets fails there by the kernel-support table (or loses a path
    that runs there); those the table does not judge apart; the harmless counted."""
    suspects = found.suspects
    files = len({s.finding.file for s in suspects})
    covered = sum(1 for s in suspects if s.covered_by)
    label = "blockers under --strict" if found.strict else "not blockers"
    on = " and ".join(found.capabilities)
    typer.echo(
        f"\nSuspects ({label}): {_count(len(suspects), 'capability gate')} in "
        f"{_count(files, 'file')} where {on} "
        f"get{'s' * (len(found.capabilities) == 1)} what does not run there by the "
        "kernel-support table"
        + (f", {covered} covered by a pending patch" if covered else "")
        + ("" if verbose or not suspects else " (--verbose lists them)")
    )
    for suspect in suspects if verbose else ():
        _print_suspect(suspect)
    unjudged = found.unjudged
    typer.echo(
        f"\nNot judged: {_count(len(unjudged), 'gate')} give{'s' * (len(unjudged) == 1)} {on} "
        "a backend the table does not know; "
        f"{found.harmless} more give what runs there (harmless, not listed)"
        + ("" if verbose or not unjudged else " (--verbose lists the former)")
    )
    for suspect in unjudged if verbose else ():
        _print_suspect(suspect)
    if found.refusals:
        typer.echo(
            f"\nNot listed: {_count(len(found.refusals), 'place')} that refuse"
            f"{'s' * (len(found.refusals) == 1)} capability 12 with an error "
            "by design (`sglpatch doctor --verbose` lists them)."
            if not verbose
            else f"\nRefuse capability 12 with an error, by design: {len(found.refusals)} places"
        )
    for f in found.refusals if verbose else ():
        typer.echo(f"  {f.file}:{f.line}: {f.code}")


def _count(n: int, noun: str) -> str:
    """`1 file`, `2 files`."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _print_suspect(suspect: Suspect) -> None:
    from sglpatch.doctor import Kind

    f = suspect.finding
    cover = f"  [covered by {suspect.covered_by}]" if suspect.covered_by else ""
    when = f"opt-in: only with {suspect.opt_in}" if suspect.opt_in else "by default"
    if f.kind is Kind.TABLE:
        when = "wherever the table is read"
    typer.echo(f"  {f.file}:{f.line}: {f.code}{cover}")
    shown = [j for j in suspect.judgements if j.outcome == suspect.outcome]
    if suspect.differs:
        shown = list(suspect.judgements)
    for judgement in shown[: None if suspect.differs else 1]:
        what = judgement.what or f"{judgement.capability} gets {f.gets}: runs there"
        typer.echo(f"      {judgement.outcome}: {what}")
    typer.echo(f"      ({when})")


def _print_kernels(report: api.DoctorReport, verbose: bool = False) -> None:
    """The compiled packages beside SGLang: a count (`verbose`: each installed one in a few
    lines), and those not installed named."""
    if report.kernels is None:
        typer.echo(
            "\nKernels: not judged (a checkout given by --target or found from the current "
            "folder: no environment is known; run doctor with --target set to the environment "
            "that runs it, its root or site-packages: its editable install leads to the checkout)"
        )
        return
    if report.kernels_from is not None and report.kernels_from != report.target.root:
        typer.echo(f"\nKernels read in {report.kernels_from}, the environment that found it.")
    from sglpatch.doctor import render_kernels

    installed = [k for k in report.kernels if k.version is not None]
    absent = [k.package for k in report.kernels if k.version is None]
    asked = report.diagnosis.capabilities  # --capability: that part alone
    if installed and verbose:
        typer.echo("")
        for line in render_kernels(installed, asked):
            typer.echo(line)
    elif installed:
        failing = [k for k in installed if any(k.runs_on.get(c) is False for c in asked)]
        part = "some capability-12 part" if len(asked) > 1 else asked[0]
        typer.echo(
            f"\nKernels: {len(installed)} installed package{'s' * (len(installed) > 1)} read, "
            f"{len(failing)} without code for {part} (--verbose shows each)"
        )
    if absent:
        typer.echo(f"\nKernels not installed beside this SGLang (not judged): {', '.join(absent)}")
