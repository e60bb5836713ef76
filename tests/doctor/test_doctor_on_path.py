"""Blockers only on the path (issue #34, point 4): with `--model`, a pending patch blocks only
where the model's own start-up reaches what it changes, with the checkpoint's config and the
launch's flags (the rows of `--all-models`, `tests/doctor/test_all_models.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

DSA = {"sm120-dsa-backends", "sm120-dsa-indexer-torch-logits", "sm120-dsa-backend-torch-schedule",
       "sm120-dsa-tilelang-shape"}  # fmt: skip


def checkpoint(folder: Path, **config: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def report(site: Path, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["doctor", "--target", str(site), "--json", *args])
    assert result.exit_code in (0, ExitCode.GAPS), result.output
    found: dict[str, object] = json.loads(result.stdout)
    return found


def blockers(found: dict[str, object]) -> set[str]:
    return {row["source"] for row in found["blockers"]}  # type: ignore[attr-defined]


def test_dsa_patches_block_the_dsa_form_only(trees: dict[str, Path], tmp_path: Path) -> None:
    site = trees[SEED]
    plain = checkpoint(tmp_path / "v3", architectures=["DeepseekV3ForCausalLM"])
    sparse = checkpoint(tmp_path / "v32", architectures=["DeepseekV3ForCausalLM"], index_topk=2048)
    without = report(site, "--model-path", str(plain))
    with_dsa = report(site, "--model-path", str(sparse))
    assert blockers(with_dsa) >= DSA
    assert not DSA & blockers(without)
    assert set(without["not_for_this_model"]) >= DSA  # type: ignore[arg-type]


def test_a_launch_flag_takes_a_start_up_patch_off_the_path(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """Olmo2 gets fa3 by default (sm120-olmo-fa3-fallback blocks); with the launch's own
    `--attention-backend triton` its start-up never reaches that choice."""
    olmo = checkpoint(tmp_path / "olmo", architectures=["Olmo2ForCausalLM"])
    default = report(trees[SEED], "--", "--model-path", str(olmo))
    assert "sm120-olmo-fa3-fallback" in blockers(default)
    chosen = report(trees[SEED], "--", "--model-path", str(olmo), "--attention-backend", "triton")
    assert "sm120-olmo-fa3-fallback" not in blockers(chosen)
    rows = [r for r in chosen["models"] if r["quantization"] is None]  # type: ignore[attr-defined]
    # Triton's attention runs on 12.0; on 12.1 it needs a ptxas that knows sm_121a.
    assert {r["capability"]: r["now"] for r in rows} == {"12.0": "runs", "12.1": "needs"}


def test_doctors_model_stands_for_the_launchs_model_path(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """`doctor --model X -- --tp 2`: the launch may leave out --model-path when doctor's own
    --model names the model (without either, the release's own requirement is the error)."""
    found = report(trees[SEED], "--model", "olmo2", "--", "--tp", "2")
    assert found["model"] == "Olmo2ForCausalLM" and found["launch"]["model_path"] is None  # type: ignore[index]
    refused = CliRunner().invoke(app, ["doctor", "--target", str(trees[SEED]), "--", "--tp", "2"])
    assert refused.exit_code == ExitCode.USAGE and "needs --model-path" in refused.output


@pytest.mark.parametrize(
    ("tower", "blocks", "with_condition"),
    [
        ({"vt_hidden_size": 1152, "vt_num_attention_heads": 16}, False, False),  # Kimi K2.5: 72
        ({"hidden_size": 4096, "num_attention_heads": 16}, True, False),  # head size 256
        (None, True, True),  # no vision_config: the condition is said
    ],
)
def test_the_vision_prefill_patch_follows_the_configs_head_size(
    trees: dict[str, Path], tmp_path: Path, tower: dict[str, int] | None, blocks: bool,
    with_condition: bool,
) -> None:  # fmt: skip
    """sm120-prefill-attention-block fixes a kernel that overflows 12's shared memory only above
    vision head size 128 (issue #34: Kimi K2.5's tower has 72)."""
    config: dict[str, object] = {"architectures": ["KimiK25ForConditionalGeneration"]}
    if tower is not None:
        config["vision_config"] = tower
    found = report(trees[SEED], "--model-path", str(checkpoint(tmp_path / "kimi", **config)))
    rows = [r for r in found["blockers"] if r["source"] == "sm120-prefill-attention-block"]  # type: ignore[attr-defined]
    assert bool(rows) is blocks
    if blocks:
        assert ("vision head size" in rows[0]["when"]) is with_condition
    else:
        assert "sm120-prefill-attention-block" in found["not_for_this_model"]  # type: ignore[operator]


DSV32 = {"architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048, "index_n_heads": 64,
         "index_head_dim": 128}  # fmt: skip
TILELANG_SHAPE = "sm120-dsa-tilelang-shape"


def test_the_bf16_tilelang_patch_follows_the_kv_cache_dtype(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """Issue #34's second user: DeepSeek-V3.2 on 0.5.23. sm120-dsa-backends gives 12 TileLang;
    0.5.23 resolves the KV cache to fp8_e4m3 on 12 by itself and the patch keeps it there, so
    TileLang builds its FP8 kernel and sm120-dsa-tilelang-shape (the bf16 kernel's shape) is not
    on the default path, nor with `--kv-cache-dtype fp8_e4m3`; with `bfloat16` it is. The rows
    say the same as the blockers."""
    model = str(checkpoint(tmp_path / "v32", **DSV32))
    for kv, on_path in ((None, False), ("fp8_e4m3", False), ("bfloat16", True)):
        launch = ["--model-path", model, *(("--kv-cache-dtype", kv) if kv else ())]
        found = report(trees["0.5.23"], "--", *launch)
        assert {"sm120-dsa-backends", "sm120-dsa-indexer-fallback"} <= blockers(found), kv
        assert (TILELANG_SHAPE in blockers(found)) is on_path, kv
        rows = [r for r in found["models"] if r["form"] == "dsa"]  # type: ignore[attr-defined]
        assert rows and all((TILELANG_SHAPE in r["patches"]) is on_path for r in rows), kv


def test_a_tilelang_patch_blocks_only_where_the_start_up_gives_tilelang(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """GLM-5 on 0.5.23: its start-up gives 12 `flashinfer_sparse_mla` (its own arm for major 12),
    before and after apply, so the TileLang shape patch is not on its path."""
    glm = {**DSV32, "architectures": ["GlmMoeDsaForCausalLM"], "index_n_heads": 32}
    found = report(trees["0.5.23"], "--model-path", str(checkpoint(tmp_path / "glm", **glm)))
    assert TILELANG_SHAPE not in blockers(found)
    assert TILELANG_SHAPE in found["not_for_this_model"]  # type: ignore[operator]
    rows = found["models"]
    assert rows and not any(TILELANG_SHAPE in r["patches"] for r in rows)  # type: ignore[attr-defined,index]
