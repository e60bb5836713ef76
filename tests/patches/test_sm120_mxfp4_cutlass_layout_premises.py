"""sm120-mxfp4-cutlass-layout's premises, read off the real wheels: which expert layouts the
models hand FusedMoE (GPT-OSS's interleaved rows and SwiGLU constants, Kimi K3's SiTU halves,
FusedMoE's defaults), that Marlin de-interleaves GPT-OSS's rows only and takes each activation
(the backend the refusal names), and that the SM120 CUTLASS runner runs SwiGLU whatever the
layer's activation. The proofs on the patched method are in test_sm120_mxfp4_cutlass_layout.py.
"""

from __future__ import annotations

import ast
import types

import pytest

from tests.support import syntax, wheels
from tests.support.stand_ins_mxfp4 import (
    INTERLEAVED,
    LAYOUTS,
    MXFP4,
    PLAIN_SILU,
    RELEASES,
    runner_config,
)

pytestmark = pytest.mark.wheel

MARLIN = "sglang/srt/layers/moe/moe_runner/marlin.py"
FUSED_MOE = "sglang/srt/layers/moe/fused_moe_triton/layer.py"


def _fused_moe_keywords(source: bytes) -> list[dict[str, str]]:
    """The keyword arguments of each call passing `gemm1_alpha=` or `gate_up_interleaved=`."""
    found = []
    for node in ast.walk(syntax.tree(source)):
        if isinstance(node, ast.Call):
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            if {"gemm1_alpha", "gate_up_interleaved"} & set(keywords):
                found.append(keywords)
    return found


@pytest.mark.parametrize("release", RELEASES)
def test_the_layouts_are_the_models_own(release: str) -> None:
    """GPT-OSS passes its alpha/limit and FusedMoE's default interleaving; Kimi K3 passes SiTU
    constants and `gate_up_interleaved=False`; FusedMoE's default is interleaved."""
    gpt_oss = wheels.member(release, "sglang/srt/models/gpt_oss.py")
    (experts,) = _fused_moe_keywords(gpt_oss)
    assert experts["gemm1_alpha"] == "self.gemm1_alpha" and "gate_up_interleaved" not in experts
    assert experts["gemm1_clamp_limit"] == "self.gemm1_clamp_limit"
    assert experts["activation"] == "self.activation"
    text = gpt_oss.decode()
    assert "self.gemm1_alpha = getattr(config, 'hidden_act_alpha', 1.702)" in ast.unparse(
        syntax.tree(gpt_oss)
    )
    assert "self.gemm1_clamp_limit = config.swiglu_limit" in text
    kimi = _fused_moe_keywords(wheels.member(release, "sglang/srt/models/kimi_k3.py"))
    routed = [k for k in kimi if k.get("gemm1_alpha") == "config.activation_situ_beta"]
    assert routed and all(k["gate_up_interleaved"] == "False" for k in routed)
    assert runner_config(release, PLAIN_SILU).gate_up_interleaved is True  # the default
    (fused,) = [
        n
        for n in ast.walk(syntax.tree(wheels.member(release, FUSED_MOE)))
        if isinstance(n, ast.ClassDef) and n.name == "FusedMoE"
    ]
    (init,) = [n for n in fused.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    arguments = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = {a.arg: ast.unparse(d) for a, d in zip(arguments, init.args.defaults, strict=True)}
    defaults |= {
        a.arg: ast.unparse(d)
        for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
        if d is not None
    }
    assert defaults["gate_up_interleaved"] == "True"


@pytest.mark.parametrize("release", RELEASES)
def test_marlin_deinterleaves_gpt_oss_only_and_takes_each_activation(release: str) -> None:
    """Marlin's own test: de-interleave w13 when `gemm1_alpha` is set and the rows are
    interleaved; its runner accepts gated silu and situ with the layer's constants."""
    tree = syntax.tree(wheels.member(release, MXFP4))
    (test,) = [
        n.test
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and any(  # the call is the branch's own statement (not one of an enclosing `if`)
            isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and ast.unparse(s.value.func) == "deinterleave_moe_mxfp4_w13_for_marlin"
            for s in n.body
        )
    ]
    condition = compile(ast.Expression(body=test), MXFP4, "eval")
    for layout in LAYOUTS:
        this = types.SimpleNamespace(moe_runner_config=runner_config(release, layout))
        deinterleaves = eval(condition, {"self": this, "getattr": getattr})
        assert bool(deinterleaves) == (layout in INTERLEAVED), layout
    marlin = syntax.tree(wheels.member(release, MARLIN))
    accepted = [
        {c.value for c in n.comparators[0].elts}  # type: ignore[attr-defined]
        for n in ast.walk(marlin)
        if isinstance(n, ast.Compare)
        and ast.unparse(n.left) == "runner_config.activation"
        and isinstance(n.ops[0], ast.In)
        and isinstance(n.comparators[0], ast.Set)
    ]
    assert {"silu", "situ"} in accepted


@pytest.mark.parametrize("release", RELEASES)
def test_the_sm120_runner_runs_swiglu_whatever_the_layer(release: str) -> None:
    """The MXFP4 CUTLASS call passes `ActivationType.Swiglu` (SwigluStep only for a flag that
    Mxfp4MoEMethod never sets), never the layer's activation."""
    runner = wheels.member(release, "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py")
    calls = [
        {k.arg: ast.unparse(k.value) for k in n.keywords if k.arg}
        for n in ast.walk(syntax.tree(runner))
        if isinstance(n, ast.Call) and any(k.arg == "swiglu_alpha" for k in n.keywords)
    ]
    mxfp4 = [c for c in calls if "mxfp8" in c.get("use_mxfp8_act_scaling", "")]
    assert len(mxfp4) == 1, calls
    activation = mxfp4[0]["activation_type"]
    assert "ActivationType.Swiglu" in activation and "runner_config" not in activation
    assert b"use_swiglu_step" not in wheels.member(release, MXFP4)
