"""Refuse FlashInfer's SM120 CUTLASS MXFP4 MoE path for experts not laid out as GPT-OSS's.

Why: from 0.5.17 `Mxfp4MoEMethod` runs `--moe-runner-backend flashinfer_mxfp4` on capability 12
as FlashInfer's CUTLASS MXFP8 x MXFP4 fused MoE (`_fi_kernel = "cutlass_sm120"`), and its weight
preparation `_process_weights_for_sm120_cutlass` was written for GPT-OSS alone: it always splits
w13 as `[gate_0, up_0, gate_1, up_1, ...]` (rows `0::2` gate, `1::2` up) and always hands the
kernel GPT-OSS's SwiGLU, alpha 1.702, beta 1, limit 7.0, whatever the layer's `MoeRunnerConfig`
says. The SM90 sibling `_process_weights_for_sm90_cutlass` reads `gate_up_interleaved`,
`gemm1_alpha` and `gemm1_clamp_limit`; the SM120 one reads none of them, and the runner
(`moe_runner/flashinfer_cutlass.py`) always passes `ActivationType.Swiglu`. Other MXFP4 MoE
experts reach `Mxfp4MoEMethod` too: Kimi K3 (compressed-tensors MXFP4, `gate_up_interleaved=False`,
SiTU activation with its own constants) and any MoE checkpoint in compressed-tensors MXFP4 or
`quant_method: mxfp4` (w1/w3 loaded as two halves, plain SiLU, no alpha). On capability 12 with
`flashinfer_mxfp4` such a model loads, half of its "up" rows are gate rows, its activation is
GPT-OSS's, and it answers wrongly without an error.

Only an explicit `--moe-runner-backend flashinfer_mxfp4` gets another model there: left on
`auto`, capability 12 is given `flashinfer_mxfp4` only by the GPT-OSS override (and DeepSeek V4,
Bailing V3 and MiMo V2 by theirs, but their FP8-with-MXFP4-experts checkpoints go to
`Mxfp4FlashinferCutlassMoEMethod`, not here); Kimi K3's override picks it on SM100/103/107 only.
So this patch keeps the path for the layout it was written for and refuses every other one in
`create_moe_runner`, which runs when the layer is built, before any weight is read (from 0.5.18
not under `--moe-a2a-backend megamoe`, whose DeepGEMM preparation comes first and returns): `silu`,
gated, `gate_up_interleaved`, `gemm1_alpha == 1.702`, `gemm1_clamp_limit == 7.0` (GPT-OSS's
`hidden_act`, its default `hidden_act_alpha` and its config's `swiglu_limit`) pass; anything
else stops with one line naming `--moe-runner-backend marlin`. Marlin runs on capability 12 and
is right for every layout: it de-interleaves w13 only when `gemm1_alpha` is set and
`gate_up_interleaved` holds, and its runner takes the layer's activation, alpha and limit
(silu and situ). It is also upstream's own advice for Kimi K3 without its SM100 kernels. Other
capabilities never take the new branch (`_fi_kernel` is "cutlass_sm120" on 12 only), nor does
capability 12 with any other backend.

Sources: sgl-project/sglang PR #32668 ("Enable GPT-OSS FlashInfer MXFP4 on SM120", the path and
its GPT-OSS-only weight preparation, shipped in 0.5.17); PR #24816 (the SM90 CUTLASS sibling,
which reads the layout from the runner config); PR #30272 (DeepSeek V4's SM120 MXFP4 experts, a
separate method that loads `[up; gate]` itself); the release trees 0.5.17-0.5.23
(`layers/quantization/mxfp4.py`, `layers/moe/moe_runner/flashinfer_cutlass.py`,
`models/kimi_k3.py`, `layers/quantization/compressed_tensors/compressed_tensors.py`,
`arg_groups/model_overrides/`); the kernel's activation, TensorRT-LLM's `SwigluBiasAdaptor`
(cutlass_kernels), which FlashInfer's CUTLASS fused MoE runs for `ActivationType.Swiglu` with
per-expert constants: `min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clamp(up, -limit,
limit) + beta)`, GPT-OSS's `(up + 1)` at beta 1, and plain SiLU only at alpha 1, beta 0, no limit;
openai/gpt-oss's reference config (`swiglu_limit=7.0`); flashinfer-ai/flashinfer issue #2847
(the SM120 MXFP4 MoE kernels, measured on gpt-oss). No public issue reports the other layouts.
The workaround without sglpatch is to leave `--moe-runner-backend` on `auto` or pass `marlin`.

Delete when: a release reads the layout and the SwiGLU constants from the runner config in
`_process_weights_for_sm120_cutlass` (none has as of 0.5.23; the patch then reports it upstream).
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AlreadyUpstream,
    AnchorMissing,
    ByRelease,
    Concerns,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

FILES = ByRelease({"<0.5.17": None, ">=0.5.17": "srt/layers/quantization/mxfp4.py"})
CLASS = "Mxfp4MoEMethod"
RUNNER = "create_moe_runner"
PREPARE = "_process_weights_for_sm120_cutlass"
INIT = "__init__"
# From 0.5.18 `--moe-a2a-backend megamoe` prepares the experts for DeepGEMM before the SM120
# branch of process_weights_after_loading, which it never reaches: no refusal there.
MEGA = "use_mega_moe"
KERNEL = "cutlass_sm120"
BACKEND = "marlin"

# The layout `_process_weights_for_sm120_cutlass` hard-codes, as the layer's MoeRunnerConfig
# states it for GPT-OSS (models/gpt_oss.py: activation=config.hidden_act, gemm1_alpha=
# getattr(config, "hidden_act_alpha", 1.702), gemm1_clamp_limit=config.swiglu_limit).
GUARD = """\
if self._fi_kernel == "{kernel}"{mega} and not (
    {config}.activation == "silu"
    and {config}.is_gated
    and {config}.gate_up_interleaved
    and {config}.gemm1_alpha == 1.702
    and {config}.gemm1_clamp_limit == 7.0
):
    # sglpatch: {prepare} splits gate/up as
    # GPT-OSS interleaves them and runs GPT-OSS's SwiGLU (alpha 1.702, beta 1,
    # limit 7); any other layout would load and answer wrongly.
    raise ValueError(
        "moe_runner_backend=flashinfer_mxfp4 on SM120 serves GPT-OSS's MXFP4 "
        "MoE layout only (interleaved gate/up, SwiGLU alpha 1.702, limit 7.0); "
        "pass --moe-runner-backend {backend}"
    )
"""


def _method(module: cst.Module, name: str) -> cst.FunctionDef:
    method = cst_tools.methods(cst_tools.find_class(module, CLASS)).get(name)
    if method is None:
        raise AnchorMissing(f"{CLASS} has no {name}()")
    return method


def _guards(runner: cst.FunctionDef) -> list[cst.If]:
    """Top-level `if`s of create_moe_runner that test for the SM120 kernel and raise."""
    return [
        s
        for s in cst_tools.function_body(runner)
        if isinstance(s, cst.If)
        and any(v.evaluated_value == KERNEL for v in cst_tools.walk(s.test, cst.SimpleString))
        and any(True for _ in cst_tools.walk(s.body, cst.Raise))
    ]


def _reads_layout(prepare: cst.FunctionDef) -> bool:
    """Whether the SM120 preparation reads the interleaving and the alpha from the config."""
    names = {a.attr.value for a in cst_tools.walk(prepare, cst.Attribute)}
    strings = (s.evaluated_value for s in cst_tools.walk(prepare, cst.SimpleString))
    names |= {s for s in strings if isinstance(s, str)}  # getattr(config, "...")
    return {"gate_up_interleaved", "gemm1_alpha"} <= names


def _config_parameter(runner: cst.FunctionDef) -> str:
    """The name create_moe_runner gives its MoeRunnerConfig, checked against its first line."""
    params = [p.name.value for p in runner.params.params]
    if len(params) != 3 or params[0] != "self":
        raise AnchorMissing(f"{RUNNER}() takes ({', '.join(params)}), not (self, layer, config)")
    return params[2]


def _stores_config(statement: cst.BaseStatement, config: str) -> bool:
    """`self.moe_runner_config = <config>`: the line the guard goes after."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and isinstance(target := assign.targets[0].target, cst.Attribute)
        and isinstance(target.value, cst.Name)
        and target.value.value == "self"
        and target.attr.value == "moe_runner_config"
        and isinstance(assign.value, cst.Name)
        and assign.value.value == config
    )


class Sm120Mxfp4CutlassLayout(Patch):
    """Keep SM120 CUTLASS MXFP4 MoE to GPT-OSS's expert layout; refuse others with one line."""

    id = "sm120-mxfp4-cutlass-layout"
    description = (
        "flashinfer_mxfp4 on capability 12 refuses MXFP4 MoE experts not laid out as GPT-OSS's "
        "(0.5.17+), naming --moe-runner-backend marlin"
    )
    symptom = (
        "a non-GPT-OSS MXFP4 MoE model (Kimi K3, compressed-tensors MXFP4) with "
        "--moe-runner-backend flashinfer_mxfp4 loads on SM120 and answers wrongly"
    )
    tested = TESTED
    files = FILES
    concerns = Concerns(
        quantization=("mxfp4", "compressed-tensors"),
        flag="--moe-runner-backend flashinfer_mxfp4",
    )
    reads = (f"{CLASS}.{INIT}", f"{CLASS}.{RUNNER}", f"{CLASS}.{PREPARE}")

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        runner = _method(module, RUNNER)
        if _guards(runner):
            raise AlreadyPresent(f"{RUNNER}() already refuses layouts on the SM120 kernel")
        if _reads_layout(_method(module, PREPARE)):
            raise AlreadyUpstream(f"{PREPARE}() reads the layout from the runner config")
        config = _config_parameter(runner)
        body = cst_tools.function_body(runner)
        anchor = next((s for s in body if _stores_config(s, config)), None)
        if anchor is None:
            raise AnchorMissing(f"{RUNNER}() does not start by storing self.moe_runner_config")
        mega = (
            f" and not self.{MEGA}"
            if cst_tools.assigns_self_attribute(_method(module, INIT), MEGA)
            else ""
        )
        text = GUARD.format(
            kernel=KERNEL, mega=mega, config=config, prepare=PREPARE, backend=BACKEND
        )
        guard = cst_tools.statement(text, module)
        new = cst_tools.with_statements_beside(runner, anchor, [guard], after=True)
        return cst_tools.replace(module, runner, new)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        try:
            runner = _method(module, RUNNER)
        except AnchorMissing as error:
            raise PostconditionFailed(str(error)) from None
        guards = _guards(runner)
        if len(guards) != 1:
            raise PostconditionFailed(f"{RUNNER}() has {len(guards)} SM120 layout refusals")
        body = list(cst_tools.function_body(runner))
        config = _config_parameter(runner)
        stored = next((i for i, s in enumerate(body) if _stores_config(s, config)), None)
        if stored is None or body.index(guards[0]) != stored + 1:
            raise PostconditionFailed("the refusal does not follow the stored runner config")
        text = module.code_for_node(guards[0].test)
        for field in ("gate_up_interleaved", "gemm1_alpha", "gemm1_clamp_limit", "activation"):
            if field not in text:
                raise PostconditionFailed(f"the refusal does not test {field}")
