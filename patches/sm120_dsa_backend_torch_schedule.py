"""On 0.5.9 - 0.5.21, the DSA backend's DeepGEMM schedule calls take the torch shim on 12 too.

Why: the DSA attention backend (`srt/layers/attention/nsa_backend.py` to 0.5.12, then
`dsa_backend.py`) precomputes the Lightning indexer's paged-MQA-logits schedule once per batch
for decode, target-verify and draft-extend, and again at CUDA-graph capture and replay:
`deep_gemm.get_paged_mqa_logits_metadata(lengths, 64, deep_gemm.get_num_sms())`, 3 - 4 times per
release. DeepGEMM has no capability-12 build of it ("Unsupported architecture", sglang issues
#26087 and #23657; DeepGEMM issues #236 and #317), so with the indexer itself on torch
(`sm120-dsa-indexer-torch-logits`) a DSA model on 12 would still die here, before the indexer
runs. 0.5.22 moved the choice into `dsa/utils.py` (`resolve_paged_mqa_logits_metadata_fn`,
`resolve_num_sms`), which `sm120-dsa-indexer-fallback` answers on 12.

The backend imports DeepGEMM inside each of those methods to 0.5.12 (`try: import deep_gemm`)
and at module level from 0.5.13 (`if is_cuda(): import deep_gemm`). This patch is
`sm120-dsa-indexer-torch-logits` applied to the backend's file: the same `_SglpatchSm120DeepGemm`
class, and `deep_gemm = _SglpatchSm120DeepGemm(deep_gemm)` after each of those imports, so on CUDA
capability 12 (unless `SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` is set false) the schedule is zeros of
DeepGEMM's shape ([num_sms + 1, 2] int32; the torch logits read none) and the SM count the
device's; elsewhere DeepGEMM's own, as before. Proven with the indexer's patch: every call site
of the real tree on every release 0.5.9 - 0.5.21 reaches the shim under stand-in 12.0 / 12.1 and
DeepGEMM under 8.9 / 9.0 / 10.0, ROCm, and on 12 with the variable 0. The rest of the backend on
12 is `sm120-dsa-backends` (TileLang) and `sm120-dsa-tilelang-shape`; what that docstring and the
indexer's leave unjudged stays so.

Delete when: the oldest release supported is 0.5.22, or the DeepGEMM these releases pin has SM120
MQA-logits kernels (upstream DeepGEMM has them since PR #324).
"""

from __future__ import annotations

from sglpatch.patch import ByRelease
from sglpatch.patches.sm120_dsa_indexer_torch_logits import SHIM, Sm120DsaIndexerTorchLogits

TARGET = ByRelease(
    {
        ">=0.5.13,<0.5.22": "srt/layers/attention/dsa_backend.py",
        ">=0.5.9,<0.5.13": "srt/layers/attention/nsa_backend.py",
        "<0.5.9": None,
        ">=0.5.22": None,
    }
)


class Sm120DsaBackendTorchSchedule(Sm120DsaIndexerTorchLogits):
    """Route the DSA backend's `deep_gemm` name through the same torch shim on capability 12."""

    id = "sm120-dsa-backend-torch-schedule"
    description = "The DSA backend's DeepGEMM paged-MQA schedule calls run as torch on 12"
    symptom = (
        "DSA models on capability 12: the backend's DeepGEMM get_paged_mqa_logits_metadata "
        "fails with 'Unsupported architecture' at the first decode batch"
    )
    files = TARGET
    applied_with = ("sm120-dsa-indexer-torch-logits",)
    # To 0.5.12 the methods import DeepGEMM themselves: the whole backend class is read.
    reads = ByRelease(
        {
            ">=0.5.13,<0.5.22": (SHIM,),
            ">=0.5.9,<0.5.13": (SHIM, "NativeSparseAttnBackend"),
        }
    )
