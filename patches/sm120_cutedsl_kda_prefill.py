"""Keep capability 12 off the CuTe DSL KDA prefill kernel (tcgen05/TMEM, SM10x only).

Why: the KDA (Kimi Linear) twin of sm120-cutedsl-gdn-prefill. `kda_cutedsl._is_blackwell()`
returns `major >= 10`, so on capability 12 the `cutedsl` linear-attention backend takes a
prefill kernel built on tcgen05/TMEM, which SM120/SM121 lack. 0.5.23 made the gate
`major == 10` (as `_is_sm10x()`), so capability 12 falls back to Triton for prefill; this patch
makes the same comparison change with the GDN patch's codemod, in the KDA file.

Delete when: the oldest release in use is 0.5.23 or newer. Before 0.5.14 the CuTe DSL KDA
kernel has no prefill gate.
"""

from __future__ import annotations

from typing import ClassVar

from packaging.version import Version

from sglpatch.patch import TESTED, ByRelease, Concerns
from sglpatch.patches.sm120_cutedsl_gdn_prefill import Sm120CutedslGdnPrefill

KERNEL = ByRelease({">=0.5.14": "srt/layers/attention/linear/kernels/kda_cutedsl.py"})


class Sm120CutedslKdaPrefill(Sm120CutedslGdnPrefill):
    """Turn `return major >= 10` into `return major == 10` in the KDA CuTe DSL gate."""

    id = "sm120-cutedsl-kda-prefill"
    description = "CuTe DSL KDA prefill kernel (tcgen05) only on capability 10; 12 uses Triton"
    symptom = "KDA backend cutedsl: the prefill kernel fails to build on SM120 (no tcgen05)"
    tested = TESTED
    fixed_upstream_in = Version("0.5.23")
    files = KERNEL
    concerns = Concerns(
        architectures=("KimiLinearForCausalLM",), flag="--linear-attn-backend cutedsl"
    )
    kernel: ClassVar[str] = "KDA"
