"""Run a release's own DSA KV-dtype and backend passes (`arg_groups/overrides.py`) on a stand-in.

The two passes (`_dsa_kv_cache_dtype_default`, then `_dsa_split_backend_resolution`, as the
release's post-process order runs them) are compiled from the release's source with the
module-level helpers they call; torch, `is_deepseek_dsa` and the server-args view are stand-ins
that report the chosen capability, architecture and flags. Nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable
from typing import Any, Optional
from unittest import mock

from tests.support import stand_ins_moe

PASSES = ("_dsa_kv_cache_dtype_default", "_dsa_split_backend_resolution")
HELPERS = ("_check_dsa_backend_constraints", "_check_tilelang_dsa_fp8_kv")


class View:
    """The resolving server-args view the passes read (and update with what they declare)."""

    def __init__(self, architecture: str, kv_cache_dtype: str, **flags: Any) -> None:
        self.hf_config = types.SimpleNamespace(architectures=[architecture], learnable_sink=False)
        self.kv_cache_dtype = kv_cache_dtype
        self.dsa_prefill_backend: str | None = None
        self.dsa_decode_backend: str | None = None
        self.dsa_topk_backend = "sgl-kernel"
        self.enable_hisparse = False
        self.dcp_size = 1
        for name, value in flags.items():
            setattr(self, name, value)

    def get_model_config(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(hf_config=self.hf_config)


def _compiled(source: bytes, names: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    tree = ast.parse(source)
    wanted = set(PASSES) | set(HELPERS) | {"_DEEPSEEK_FAMILY_ARCHS"}
    body = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in wanted)
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets)
        )
    ]
    for node in body:  # `@register_post_process` only registers; run the functions bare
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
    namespace = dict(names)
    exec(compile(ast.Module(body=body, type_ignores=[]), "overrides.py", "exec"), namespace)
    return {name: namespace[name] for name in PASSES}


def resolve(source: bytes, release: str, capability: tuple[int, int], view: View) -> dict[str, Any]:
    """What the release's two passes leave set: KV dtype and DSA prefill/decode backends."""
    names = stand_ins_moe.host_names(release, capability)
    platform = stand_ins_moe.StandInPlatform(capability)
    platform.is_npu = False  # type: ignore[attr-defined]  # the DSA passes ask it too
    names.update(
        {
            "Any": Any,
            "Dict": dict,
            "Optional": Optional,
            "model_config_of": lambda v: v.get_model_config(),
            "is_xpu": lambda: False,
            "get_platform": lambda: platform,
        }
    )
    passes = _compiled(source, names)
    configs = types.ModuleType("sglang.srt.configs.model_config")
    configs.is_deepseek_dsa = lambda config: True  # type: ignore[attr-defined]
    modules = {
        "torch": stand_ins_moe.stand_in_torch(capability),
        "sglang.srt.configs.model_config": configs,
    }
    with mock.patch.dict(sys.modules, modules):
        for name in PASSES:
            for key, value in passes[name](view).items():
                setattr(view, key, value)
    return {
        "kv_cache_dtype": view.kv_cache_dtype,
        "prefill": view.dsa_prefill_backend,
        "decode": view.dsa_decode_backend,
    }
