"""Give Kimi K2.5 the target-model interface that EAGLE-3 speculative decoding calls.

Why: the EAGLE worker calls `target_worker.model_runner.model.get_embed_and_head()` and
`set_embed_and_head(embed, head)`, and the model runner calls
`model.set_eagle3_layers_to_capture(layer_ids)`. `KimiK25ForConditionalGeneration` wraps a
`DeepseekV3ForCausalLM` as `self.language_model`, which has all three, but does not expose them,
so speculative decoding cannot start. Each added method delegates to `self.language_model`.

Delete when: the oldest release in use is 0.5.10, which added these methods upstream.
"""

from __future__ import annotations

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

CLASS = "KimiK25ForConditionalGeneration"
DELEGATE = "language_model"

# The model file first shipped in 0.5.9.
MODEL_FILE = ByRelease({">=0.5.9": "srt/models/kimi_k25.py"})

# name -> (positional parameters after self, how many of them have defaults, source)
METHODS: dict[str, tuple[int, int, str]] = {
    "get_embed_and_head": (
        0,
        0,
        f"def get_embed_and_head(self):\n    return self.{DELEGATE}.get_embed_and_head()\n",
    ),
    "set_embed_and_head": (
        2,
        0,
        "def set_embed_and_head(self, embed, head):\n"
        f"    return self.{DELEGATE}.set_embed_and_head(embed, head)\n",
    ),
    "set_eagle3_layers_to_capture": (
        1,
        1,
        "def set_eagle3_layers_to_capture(self, layer_ids: list[int] | None = None) -> None:\n"
        f"    self.{DELEGATE}.set_eagle3_layers_to_capture(layer_ids)\n",
    ),
}
COMMENT = f"# EAGLE-3 target-model interface (added by sglpatch): delegate to self.{DELEGATE}."


class KimiK25Eagle3Interface(Patch):
    """Add get/set_embed_and_head and set_eagle3_layers_to_capture to the Kimi K2.5 model."""

    id = "kimi-k25-eagle3-interface"
    description = "Kimi K2.5 exposes the EAGLE-3 target-model methods of its language model"
    symptom = (
        "EAGLE-3 on Kimi K2.5 fails at start-up: "
        "KimiK25ForConditionalGeneration has no get_embed_and_head()"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.10")
    files = MODEL_FILE
    concerns = Concerns(architectures=(CLASS,))

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        model = cst_tools.find_class(module, CLASS)
        missing = [name for name in METHODS if name not in cst_tools.method_names(model)]
        if not missing:
            raise AlreadyPresent(f"{CLASS} has {', '.join(METHODS)}")
        if not cst_tools.assigns_self_attribute(model, DELEGATE):
            raise AnchorMissing(f"{CLASS} never sets self.{DELEGATE} to delegate to")
        added = []
        for index, name in enumerate(missing):
            method = cst_tools.statement(METHODS[name][2], module)
            if not isinstance(method, cst.FunctionDef):  # the table's source is a method
                raise PostconditionFailed(f"the code for {name} is not a function")
            lines = [cst.EmptyLine(indent=False)]
            if index == 0:
                lines.append(cst.EmptyLine(comment=cst.Comment(COMMENT)))
            added.append(method.with_changes(leading_lines=lines))
        return cst_tools.replace(module, model, cst_tools.append_to_class(model, added))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        defined = cst_tools.methods(cst_tools.find_class(module, CLASS))
        for name, (positional, defaults, _) in METHODS.items():
            method = defined.get(name)
            if method is None:
                raise PostconditionFailed(f"{CLASS}.{name} is missing")
            params = method.params.params[1:]  # after self
            if len(params) != positional or sum(p.default is not None for p in params) < defaults:
                raise PostconditionFailed(f"{CLASS}.{name} does not take the EAGLE-3 arguments")
