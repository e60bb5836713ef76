#!/usr/bin/env python3
"""Write docs/kernel-support.md from the kernel-support table
(patcher/doctor/facts/kernel_support.json).

One row per reading of each record (a record's `earlier` readings get their own rows, named by
the SGLang releases they hold for), the capabilities doctor compares (12.0, 12.1, 10.0, 9.0),
then what it needs and where the fact comes from; the choices the table does not judge follow.

    .venv/bin/python scripts/kernel_support_doc.py          # regenerate docs/kernel-support.md
    .venv/bin/python scripts/kernel_support_doc.py --check  # exit 1 if the document is stale
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    root = str(Path(__file__).resolve().parent.parent)  # found from any folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    os.execv(sys.executable, [sys.executable, "-m", "scripts.kernel_support_doc", *sys.argv[1:]])

from scripts.generated_doc import cell
from scripts.generated_doc import main as write_or_check
from sglpatch.doctor.facts import gpus

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "kernel-support.md"
# The columns: the parts doctor answers for, then those SGLang's gates compare them with.
CAPABILITIES = tuple(g.capability for g in (*gpus.ASKED, gpus.B200, gpus.HOPPER))
SHOWN = {True: "runs", False: "no", None: "unknown"}

HEADER = """\
# Kernel support by compute capability

Generated from `patcher/doctor/facts/kernel_support.json` by `scripts/kernel_support_doc.py`; do
not edit by hand (a test checks the two agree). Doctor and the patches read the same table
through `sglpatch.doctor.facts.kernel_support`. "runs": the kernel's own arch list or assertion
admits the capability; "no": it does not; "unknown": not established (doctor reports such a
backend as "not judged"). "other kernels" in `needs`: the backend runs other kernels there than
on 10.x under the same name, so doctor does not judge a lost path to it (whether it serves a
model there is unknown). A row named with SGLang releases is the reading for those releases; the
row without is the newest. GEMM backends are named by flag: `fp8:` for `--fp8-gemm-backend`,
`fp4:` for `--fp4-gemm-backend`.
"""


def _span(span: tuple[tuple[int, int], tuple[int, int] | None]) -> str:
    low, high = span
    shown = f"{low[0]}.{low[1]}"
    return shown if high == low else f"{shown}-{high[0]}.{high[1]}" if high else f"{shown}+"


def render() -> str:
    from sglpatch.doctor.facts import kernel_support as support

    lines = [HEADER, "| kind | backend | 12.0 | 12.1 | 10.0 | 9.0 | needs | source |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for kind, name in sorted(
        support.table(), key=lambda key: (support.KINDS.index(key[0]), key[1])
    ):
        for record in support.variants(kind, name):
            shown = f"`{name}`" + (f" (SGLang {record.sglang})" if record.sglang else "")
            cells = [SHOWN[record.judge(c)] for c in CAPABILITIES]
            needs = record.needs or ""
            if record.other_kernel:
                ported = ", ".join(_span(span) for span in record.other_kernel_on)
                other = f"on {ported} other kernels: {record.other_kernel}"
                needs = f"{needs}; {other}" if needs else other
            row = [
                kind,
                shown,
                *cells,
                cell(needs),
                cell(record.source),
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "## Not judged",
        "",
        "Choices a release offers that the table does not judge:",
        "",
    ]
    lines += ["| kind | backend | why |", "|---|---|---|"]
    for (kind, name), reason in sorted(
        support.not_judged().items(), key=lambda item: (support.KINDS.index(item[0][0]), item[0][1])
    ):
        lines.append(f"| {kind} | `{name}` | {cell(reason)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, __doc__.splitlines()[0], DOC, render, __file__)


if __name__ == "__main__":
    sys.exit(main())
