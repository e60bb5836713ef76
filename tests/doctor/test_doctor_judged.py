"""Suspects judged against the kernel-support table: what 12.0 and 12.1 get, and why it fails."""

from __future__ import annotations

from sglpatch.doctor import judged
from sglpatch.doctor.gates import devices, scanner

HELPERS = devices.KNOWN_HELPERS
IMPORTS = "from sglang.srt.utils import get_device_sm, is_blackwell_supported, is_sm100_supported\n"


def _judged(code: str, release: str = "0.5.9") -> list[tuple[judged.Judgement, ...]]:
    found = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/srt/m.py", HELPERS)
    return [judged.judge_all(f, release) for f in found]


def test_an_elif_behind_a_test_not_about_the_gpu_is_judged() -> None:
    code = (
        "def pick(self):\n"
        "    if self.attention_backend is None:\n"
        "        if is_cuda() and is_sm100_supported():\n"
        '            self.attention_backend = "trtllm_mha"\n'
        "        elif is_cuda() and get_device_sm() >= 80:\n"
        '            self.attention_backend = "fa3"\n'
        "        else:\n"
        '            self.attention_backend = "triton"\n'
    )
    ((first, second),) = _judged(code)
    assert first.outcome == second.outcome == judged.FAILS
    assert first.what.startswith("12.0 gets fa3 (attention") and "8.0-9.0 only" in first.what
    assert first.opt_in == ""  # `attention_backend is None`: the default


def test_a_gate_inside_an_and_chain_behind_an_unknown_first_test() -> None:
    code = (
        "def dispatch():\n"
        "    if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM:\n"
        "        return deepgemm_w8a8_block_fp8_linear_with_fallback\n"
        "    elif is_blackwell_supported() and is_flashinfer_available():\n"
        "        return flashinfer_gemm_w8a8_block_fp8_linear_with_fallback\n"
        "    return triton_w8a8_block_fp8_linear\n"
    )
    ((judgement, _),) = _judged(code)
    assert judgement.outcome == judged.FAILS and "fp8:flashinfer_trtllm" in judgement.what
    # From 0.5.10 that entry point picks CUTLASS on 12: the mapping holds for 0.5.9 only.
    ((later, _),) = _judged(code, "0.5.10")
    assert later.outcome == judged.HARMLESS


def test_a_choice_that_runs_on_12_is_harmless_and_an_unknown_one_not_judged() -> None:
    runs = 'if is_sm100_supported():\n    moe_runner_backend = "flashinfer_trtllm"\nelse:\n    moe_runner_backend = "triton"\n'
    assert [j.outcome for j in _judged(runs)[0]] == [judged.HARMLESS] * 2
    unknown = 'if is_blackwell_supported():\n    moe_runner_backend = "cutlass"\n'
    ((judgement, _),) = _judged(unknown)
    assert judgement.outcome == judged.NOT_JUDGED and "cutlass" in judgement.what
    made_up = 'if is_blackwell_supported():\n    moe_runner_backend = "no_such_runner"\n'
    assert _judged(made_up)[0][0].outcome == judged.NOT_JUDGED


def test_a_flag_the_user_passes_makes_it_opt_in() -> None:
    code = (
        "def f(self):\n"
        "    if self.enable_something:\n"
        "        if is_blackwell_supported():\n"
        '            self.moe_runner_backend = "flashinfer_trtllm"\n'
    )
    ((judgement, _),) = _judged(code)
    assert judgement.outcome == judged.FAILS and judgement.opt_in == "self.enable_something"


def test_a_path_that_runs_on_12_and_only_10_gets_is_a_loss() -> None:
    code = 'if is_sm100_supported():\n    attention_backend = "flashinfer"\nelse:\n    attention_backend = "triton"\n'
    ((judgement, _),) = _judged(code)
    assert judgement.outcome == judged.LOSES and "10 gets flashinfer" in judgement.what


def test_12_1_is_judged_apart_where_the_source_tells_them_apart() -> None:
    """0.5.20's DeepGEMM switch probes the SM120 entry point on 12.0 only: 12.1 gets DeepGEMM
    without it, which the table says does not run there on 0.5.20."""
    code = (
        "def _compute_enable_deep_gemm():\n"
        "    sm_version = get_device_sm()\n"
        "    if sm_version < 90:\n"
        "        return False\n"
        "    if sm_version == 120:\n"
        "        try:\n"
        "            from deep_gemm import m_grouped_fp8_fp4_gemm_nt_contiguous\n"
        "        except ImportError:\n"
        "            return False\n"
        "    return True\n"
    )
    first = _judged(code, "0.5.20")[0]  # `sm_version < 90`: 12 goes on to turn it on
    assert {j.capability: j.outcome for j in first} == {
        "12.0": judged.NOT_JUDGED,
        "12.1": judged.FAILS,
    }


def test_a_later_early_return_turns_the_flag_off() -> None:
    code = (
        "def _compute_enable_deep_gemm():\n"
        "    sm_version = get_device_sm()\n"
        "    if sm_version < 90:\n"
        "        return False\n"
        "    if sm_version in (120, 121):\n"
        "        return False\n"
        "    return True\n"
    )
    assert all(j.outcome == judged.HARMLESS for js in _judged(code) for j in js)


def test_the_device_is_cuda_on_nvidia() -> None:
    code = (
        "def f(self):\n"
        "    if is_sm100_supported():\n"
        '        self.attention_backend = "trtllm_mha"\n'
        '    elif self.device == "xpu":\n'
        '        self.attention_backend = "intel_xpu"\n'
        "    else:\n"
        '        self.attention_backend = "triton"\n'
    )
    (finding,) = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/m.py", HELPERS)
    assert "triton" in finding.gets and "intel_xpu" not in finding.gets
