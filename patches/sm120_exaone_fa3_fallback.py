"""Give EXAONE 4 / EXAONE MoE (sliding window) on capability 12 Triton attention, not FA3.

Why: the EXAONE twin of sm120-olmo-fa3-fallback. From 0.5.22 the EXAONE override
(`arg_groups/model_overrides/exaone.py`, for `Exaone4ForCausalLM`, `ExaoneMoEForCausalLM` and
`ExaoneMoeForCausalLM` checkpoints with a `sliding_window_pattern`) picks an attention backend
when none is given: `trtllm_mha` on SM100, `fa3` for every other CUDA GPU with
`device_sm >= 80`, Triton below. Capability 12 passes `>= 80`, and FlashAttention 3 then stops
the start-up with "FlashAttention v3 Backend requires SM>=80 and SM<=90". The release accepts
only fa3, triton and trtllm_mha for these models (`model_hook.py`); capability 12 gets the
branch's own fallback, Triton, from the same codemod (trtllm_mha reaches 12 only through
FlashInfer's XQA and fmha_v2 kernels, a path this patch does not choose for it).

Sources: found in the release trees (issue 19); no upstream issue or PR names it. The
workaround without sglpatch is `--attention-backend triton`.

Delete when: a release fixes it upstream (none has as of 0.5.23). Before 0.5.22 the override
chose no backend (an unset one fails the release's own check on every GPU alike).
"""

from __future__ import annotations

from typing import ClassVar

from sglpatch.patch import TESTED, ByRelease, Concerns
from sglpatch.patches.sm120_olmo_fa3_fallback import Sm120OlmoFa3Fallback

OVERRIDE = ByRelease({">=0.5.22": "srt/arg_groups/model_overrides/exaone.py"})


class Sm120ExaoneFa3Fallback(Sm120OlmoFa3Fallback):
    """Insert a capability-12 -> Triton branch before EXAONE's `>= 80 -> fa3` branch."""

    id = "sm120-exaone-fa3-fallback"
    description = "EXAONE 4 (sliding window) without --attention-backend: 12 gets triton, not fa3"
    symptom = "EXAONE 4 dies at start-up: FlashAttention v3 Backend requires SM>=80 and SM<=90"
    tested = TESTED
    files = OVERRIDE
    concerns = Concerns(
        architectures=("Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM")
    )
    function: ClassVar[str] = "_exaone_overrides"
    architecture: ClassVar[str] = "Exaone4ForCausalLM"
