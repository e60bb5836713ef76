"""On 0.5.9 - 0.5.21, send the DSA Lightning indexer's DeepGEMM MQA-logits calls to torch on 12.

Why: every DSA model (DeepSeek-V3.2, GLM-5, GLM-5.3-Flash, ...) scores its KV cache with the
Lightning indexer (`srt/layers/attention/nsa/nsa_indexer.py` to 0.5.12, then
`srt/layers/attention/dsa/dsa_indexer.py`) before any sparse-attention backend runs. On CUDA it
calls DeepGEMM through its module global `deep_gemm` (`if _is_cuda: try: import deep_gemm`):
`get_num_sms()` when it is built, `fp8_mqa_logits` at prefill (4 calls: plain, chunked, and two
with prefill context parallelism; 2 from 0.5.20), `get_paged_mqa_logits_metadata` and
`fp8_paged_mqa_logits` at decode, target-verify and draft-extend (1 - 3 each; from 0.5.15 the
logits function and the schedule function are handed to `deepgemm_paged_mqa_logits_native` /
`_split` / the CuTe DSL runner as arguments, read off the same global). The DeepGEMM builds these
releases install have SM90 and SM100 kernels only: on an RTX PRO 6000, RTX 5090 or GB10 the first
forward dies with "Unsupported architecture" (sglang issues #26087, GLM-5.1 on 0.5.12, and
#23657; DeepGEMM issues #236 and #317). None of these releases has another path on CUDA (their
paged-logits backend choice offers `deepgemm` and SM100's `cutedsl`; `sgl_kernel`'s logits are
XPU's). 0.5.22's DSA indexer has a torch path behind `SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` (an
`EnvBool` since 0.5.12, read before by DeepSeek-V4's indexer alone), which
`sm120-dsa-indexer-fallback` takes on 12; the public GLM-5.3-Flash image for RTX PRO 6000
(0xSero/glm-5.3-flash-sglang-sm120) sets that variable by hand, and sglang PR #29586 (open)
proposes the same selection for GLM-5.2.

The patch rebinds the name every call goes through: right after each `import deep_gemm` of the
file, `deep_gemm = _SglpatchSm120DeepGemm(deep_gemm)`, a small object (inserted before the first
statement that imports) whose four names above are torch code on CUDA capability 12 (12.0 and
12.1; `is_cuda()` is False on ROCm, whose gfx1250 reports major 12) unless the user set
`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` to a false value (a DeepGEMM with SM120 MQA-logits kernels,
DeepGEMM PR #324): 0.5.22's meaning of the variable on 12. Any other name, and every other device,
reach the real module, as before. It decides once, at the first of those names asked for (the
indexer's constructor), so nothing is read at import. The DSA backend's own schedule calls are
`sm120-dsa-backend-torch-schedule`, the same object in `nsa_backend.py` / `dsa_backend.py`.

The torch code is ours, written from DeepGEMM's semantics (its README and the reference functions of
its `tests/test_attention.py`): logits[m, n] = sum over heads of weights[m, h] * relu(q[m, h] .
k[n]) * k_scale[n], in float32 (FP8 products are exact there), for the keys a row sees (ks <= n <
ke; paged: n <= context - next_n + j, or n < context for two-dimensional lengths); elsewhere -inf
with `clean_logits`, else 0 (every call site passes False; 0.5.22's torch path writes 0). The paged
cache is DeepGEMM's: per 64-token block, 64 rows of 128 FP8 bytes, then 64 float32 scales. Rows are
strided to multiples of 4 (ragged) and 256 (paged) elements, which the top-k kernels expect
(DeepGEMM's own ragged rows are wider; no caller reads past a row's keys). The schedule metadata is
DeepGEMM's, read by its kernel alone: the torch path returns zeros of its shape. No host
synchronisation, so CUDA graphs capture it.

Proven (tests/patches/test_sm120_dsa_indexer_torch_logits.py): on every release 0.5.9 - 0.5.21
each call site of the real tree reaches the torch code under stand-in 12.0 / 12.1 and DeepGEMM's
own functions under 8.9 / 9.0 / 10.0, ROCm, and on 12 with the variable 0. With CPU torch, the
torch code as inserted equals 0.5.22's own `_fp8_mqa_logits_torch` and `_fp8_paged_mqa_logits_torch`
(loaded from its wheel) on random FP8 inputs of the call sites' shapes (32 and 64 heads, head dim
128, 64-token blocks, contexts 1 - 1000, next_n 1 and 2): exactly 0 outside each row's keys,
inside within 2^-7 of the sum of the terms' magnitudes (0.5.22 rounds each head's scores to
bfloat16, 2^-8; ours is float32, within 1e-5 of a float64 reference). Measured on 14 cases
(torch 2.13 CPU): ours 1.8e-7 from the reference, 0.5.22 1.8e-3 from it and from ours, DeepGEMM's
`calc_diff` between the two 2.1e-6 (its own tests require < 1e-3).

Not judged on 12: the rest of the indexer's path (TileLang's `act_quant`, the index-K cache store,
the top-k kernels), DeepGEMM's SM-count bookkeeping around it (`configure_deep_gemm_num_sms`, no
kernel; DeepGEMM must still import, as the release requires), the opt-in DSA K-pool
(`dsa_indexer_kpool.py`, 0.5.20+, DeepGEMM's on 12 as on 0.5.22+) and DeepSeek-V4's indexer; the
torch code has not run on a capability-12 GPU, and is slower than a kernel. Prefill scores one head
at a time, every temporary (the masks included) one slice of rows of at most 1 GiB, beside the
logits the release budgets memory for. Decode gathers into float32 every page of the block table,
whose width is the longest context the backend was sized for (under CUDA graphs, the model's context
length), not each request's: its cost per step grows with that length, as 0.5.22's own torch path
does.

Delete when: the oldest release supported is 0.5.22 (its own torch path, taken on 12 by
`sm120-dsa-indexer-fallback`), or the DeepGEMM these releases pin has SM120 MQA-logits kernels
(upstream DeepGEMM has them since PR #324).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AnchorMissing,
    ByRelease,
    Concerns,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)
from sglpatch.patches.sm120_dsa_backends import DSA_ARCHITECTURES, DSA_CONFIG

SHIM = "_SglpatchSm120DeepGemm"
REBIND = f"deep_gemm = {SHIM}(deep_gemm)"
ROUTED = (
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "get_num_sms",
)
VARIABLE = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"

# 0.5.22 has a torch path of its own (sm120-dsa-indexer-fallback); before 0.5.9 nothing chooses
# DSA attention on CUDA.
TARGET = ByRelease(
    {
        ">=0.5.13,<0.5.22": "srt/layers/attention/dsa/dsa_indexer.py",
        ">=0.5.9,<0.5.13": "srt/layers/attention/nsa/nsa_indexer.py",
        "<0.5.9": None,
        ">=0.5.22": None,
    }
)

# The generated code: needs only the module's own `torch` and `is_cuda` (both imported by every
# target), so it works inside a user's SGLang without sglpatch.
SHIM_CODE = f'''\
class {SHIM}:
    """sglpatch (sm120-dsa-indexer-torch-logits, sm120-dsa-backend-torch-schedule): DeepGEMM
    has no capability-12 build of its MQA-logits kernels ("Unsupported architecture"). On CUDA
    capability 12, unless {VARIABLE} is set false (a DeepGEMM that has
    them), these names are torch code with DeepGEMM's semantics; other names and other devices
    reach DeepGEMM."""

    ROUTED = (
        "fp8_mqa_logits",
        "fp8_paged_mqa_logits",
        "get_paged_mqa_logits_metadata",
        "get_num_sms",
    )
    CHUNK_BYTES = 1 << 30  # float32 temporaries per slice of rows
    on_torch = None  # decided at the first routed name asked for, not at import

    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        if name in self.ROUTED and self.torch_path():
            return getattr(self, "torch_" + name)
        return getattr(self.module, name)

    @classmethod
    def torch_path(cls):
        if cls.on_torch is None:
            import os

            value = os.environ.get("{VARIABLE}")
            cls.on_torch = bool(
                is_cuda()
                and torch.cuda.get_device_capability()[0] == 12
                and (value is None or value.lower() in ("true", "1", "yes", "y"))
            )
        return cls.on_torch

    @staticmethod
    def torch_get_num_sms():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    @staticmethod
    def torch_get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        # DeepGEMM's schedule ([num_sms + 1, 2] int32) is read by its own kernel alone
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)

    @classmethod
    def torch_fp8_mqa_logits(cls, q, kv, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
        # [M, N]: sum over heads of weights[m, h] * relu(q[m, h] . k[n]) * k_scale[n], for
        # ks[m] <= n < ke[m]; elsewhere -inf if clean_logits, else 0
        if max_seqlen_k:
            raise NotImplementedError("sglpatch: compressed MQA logits on capability 12")
        keys = kv[0].reshape(kv[0].shape[0], -1).float().t()
        rows, n = q.shape[0], keys.shape[1]
        logits = torch.zeros(rows, -(-n // 4) * 4, dtype=torch.float32, device=q.device)[:, :n]
        scales, positions = kv[1].reshape(1, n).float(), torch.arange(n, device=q.device)
        fill = float("-inf") if clean_logits else 0.0
        step = max(1, cls.CHUNK_BYTES // (8 * max(n, 1)))
        for start in range(0, rows, step):  # every temporary is one slice of rows
            part, out = q[start : start + step].float(), logits[start : start + step]
            w = weights[start : start + step].float()
            for h in range(q.shape[1]):
                out.addcmul_((part[:, h] @ keys).relu_(), w[:, h : h + 1])
            out.mul_(scales)
            low = ks[start : start + step].reshape(-1, 1)
            high = ke[start : start + step].reshape(-1, 1)
            out.masked_fill_((positions < low) | (positions >= high), fill)
        return logits

    @classmethod
    def torch_fp8_paged_mqa_logits(
        cls, q, kv_cache, weights, context_lens, block_table, schedule, max_len, clean_logits=False
    ):
        # q [B, next_n, H, D]; kv_cache [blocks, block_kv, 1, D + 4] bytes: a block's block_kv
        # rows of D FP8 values, then their float32 scales; weights [B * next_n, H];
        # context_lens [B] (query j sees keys <= len - next_n + j) or [B, next_n] (keys < len)
        batch, next_n, heads, dim = q.shape
        block_kv, pages = kv_cache.shape[1], kv_cache.reshape(kv_cache.shape[0], -1)
        width = block_table.shape[1] * block_kv
        lens = context_lens.reshape(-1, 1)
        if context_lens.dim() == 1:
            lens = (lens - next_n + 1 + torch.arange(next_n, device=q.device)).reshape(-1, 1)
        padded = -(-max_len // 256) * 256
        logits = torch.zeros(batch * next_n, padded, dtype=torch.float32, device=q.device)
        logits = logits[:, :max_len]
        keep, positions = min(width, max_len), torch.arange(max_len, device=q.device)
        step = max(1, cls.CHUNK_BYTES // (4 * width * (2 * dim + 3 * next_n * heads) + 1))
        for start in range(0, batch, step):
            stop = min(start + step, batch)
            blocks = pages[block_table[start:stop].clamp(min=0)]
            values = blocks[..., : block_kv * dim].contiguous().view(q.dtype).float()
            scales = blocks[..., block_kv * dim :].contiguous().view(torch.float32)
            queries = q[start:stop].float().reshape(stop - start, next_n * heads, dim)
            scores = torch.bmm(values.reshape(stop - start, width, dim), queries.transpose(1, 2))
            scores = scores.relu_().reshape(stop - start, width, next_n, heads)
            w = weights[start * next_n : stop * next_n].float()
            part = (scores * w.reshape(stop - start, 1, next_n, heads)).sum(-1).transpose(1, 2)
            part = part * scales.reshape(stop - start, 1, width)
            rows = logits[start * next_n : stop * next_n]
            rows[:, :keep] = part.reshape(-1, width)[:, :keep]
            unseen = positions >= lens[start * next_n : stop * next_n]
            rows.masked_fill_(unseen, float("-inf") if clean_logits else 0.0)
        return logits
'''


def _is_import(line: cst.BaseStatement) -> bool:
    """`import deep_gemm`, alone on its line."""
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Import)
        and len(line.body[0].names) == 1
        and isinstance(line.body[0].names[0].name, cst.Name)
        and line.body[0].names[0].name.value == "deep_gemm"
        and line.body[0].names[0].asname is None
    )


def _is_rebind(module: cst.Module, line: cst.BaseStatement | None) -> bool:
    return line is not None and module.code_for_node(line).strip() == REBIND


def _rebound(module: cst.Module) -> tuple[cst.Module, int]:
    """`module` with `REBIND` after every `import deep_gemm`, in whatever block it stands, and
    how many it added. (The transformer is made here: `status` must not load libcst.)"""
    rebind = cst.parse_statement(REBIND)
    added = 0

    def body(lines: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        nonlocal added
        out: list[cst.BaseStatement] = []
        for line in lines:
            out.append(line)
            if _is_import(line):
                out.append(rebind)
                added += 1
        return out

    class Rebind(cst.CSTTransformer):
        def leave_IndentedBlock(
            self, original: cst.IndentedBlock, updated: cst.IndentedBlock
        ) -> cst.IndentedBlock:
            return updated.with_changes(body=body(updated.body))

        def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
            return updated.with_changes(body=body(updated.body))

    return module.visit(Rebind()), added


def _imports(module: cst.Module) -> list[tuple[cst.BaseStatement, cst.BaseStatement | None]]:
    """Each `import deep_gemm` line with the statement after it in its block."""
    blocks: list[tuple[cst.BaseStatement, ...]] = [tuple(module.body)]
    blocks += [tuple(b.body) for b in cst_tools.walk(module, cst.IndentedBlock)]
    return [
        (line, block[i + 1] if i + 1 < len(block) else None)
        for block in blocks
        for i, line in enumerate(block)
        if _is_import(line)
    ]


def _shims(module: cst.Module) -> list[int]:
    return [
        i for i, s in enumerate(module.body) if isinstance(s, cst.ClassDef) and s.name.value == SHIM
    ]


def _first_importing(module: cst.Module) -> int:
    """Index of the first top-level statement that imports deep_gemm (at any depth)."""
    for i, statement in enumerate(module.body):
        if _is_import(statement) or any(
            _is_import(line) for line in cst_tools.walk(statement, cst.SimpleStatementLine)
        ):
            return i
    raise AnchorMissing("the module does not import deep_gemm")


class Sm120DsaIndexerTorchLogits(Patch):
    """Route the indexer's `deep_gemm` name through a torch shim on capability 12."""

    id = "sm120-dsa-indexer-torch-logits"
    description = "The DSA indexer's DeepGEMM MQA-logits calls run as torch on capability 12"
    symptom = (
        "DSA models on capability 12: the indexer's DeepGEMM fp8_mqa_logits / "
        "get_paged_mqa_logits_metadata fail with 'Unsupported architecture' at the first forward"
    )
    tested = TESTED
    files = TARGET
    concerns = Concerns(architectures=DSA_ARCHITECTURES, config=DSA_CONFIG)
    # Without its other half the backend's schedule would come from DeepGEMM, and with it alone
    # a DeepGEMM kernel would be handed the shim's empty schedule.
    applied_with = ("sm120-dsa-backend-torch-schedule",)
    # The indexer imports DeepGEMM at module level only (its test checks every call site reads
    # that global); every def and class but the shim is left unparsed.
    reads: ClassVar[tuple[str, ...] | ByRelease[tuple[str, ...]] | None] = (SHIM,)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        if _shims(module):
            raise AlreadyPresent(f"the module already routes deep_gemm through {SHIM}")
        imports = _imports(module)
        if not imports or any(_is_rebind(module, after) for _, after in imports):
            raise AnchorMissing("expected `import deep_gemm` lines not yet rebound")
        if "is_cuda" not in cst_tools.imported_names(module, "sglang.srt.utils"):
            raise AnchorMissing("the module does not import is_cuda from sglang.srt.utils")
        if not any(
            isinstance(s, cst.SimpleStatementLine)
            and module.code_for_node(s).strip() == "import torch"
            for s in module.body
        ):
            raise AnchorMissing("the module does not import torch")
        at = _first_importing(module)
        module, added = _rebound(module)
        if added != len(imports):
            raise AnchorMissing("an `import deep_gemm` was not rebound")
        shim = cst_tools.statement(SHIM_CODE, module)
        if not isinstance(shim, cst.ClassDef):
            raise AnchorMissing(f"{SHIM} did not parse as a class")
        body = list(module.body)
        body.insert(at, shim.with_changes(leading_lines=(cst.EmptyLine(), cst.EmptyLine())))
        return module.with_changes(body=body)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        shims = _shims(module)
        expected = module.code_for_node(cst_tools.statement(SHIM_CODE, module))
        if (
            len(shims) != 1
            or module.code_for_node(module.body[shims[0]].with_changes(leading_lines=()))
            != expected
        ):
            raise PostconditionFailed(f"the module does not define {SHIM} as sglpatch writes it")
        imports = _imports(module)
        if not imports or not all(_is_rebind(module, after) for _, after in imports):
            raise PostconditionFailed("an `import deep_gemm` is not rebound to the shim")
        if shims[0] > _first_importing(module):
            raise PostconditionFailed(f"{SHIM} is defined after deep_gemm is first imported")
