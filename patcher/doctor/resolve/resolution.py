"""Run a release's own ServerArgs resolution for one model on a stand-in device.

Which attention, DSA, MoE and GEMM backends the release's default-flag start-up gives a model
on capability 12.0, 12.1 (or any other). Nothing here imports torch or SGLang. A sandbox
(`sandbox.py`) serves the release's modules from its files:

- the modules that make the choice run whole, from their source (possibly patched in memory):
  `srt/server_args.py`, everything under `srt/arg_groups/`, `srt/environ.py`;
- every other SGLang module is *lifted* (`lifting.py`): a name is defined, on first use, by
  running the statement of the real module that defines it (and, first, those its free names
  need), so `is_deepseek_nsa`, `AttentionArch` or `get_platform` are the release's own code.
  The capability probes in `srt/utils/common.py` run against a stand-in `torch.cuda` reporting
  the chosen capability;
- torch and every third-party module are stand-ins whose unknown attributes are `Unknown`
  values (`stand_ins.py`). An `Unknown` that the code decides with (truth value, comparison,
  iteration) is logged, and a result that depended on one is not evaluated, never a choice.

The model is a stand-in `ModelConfig` (`model.py`): its hf_config has the attributes given
(an architecture and a checkpoint's `quantization_config` at least); its `attention_arch` is MLA
when the release's own ModelConfig lists the architecture as MLA. A model attribute the stand-in
does not carry raises, and the outcome says which one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from sglpatch.doctor.resolve.files import ReleaseFiles
from sglpatch.doctor.resolve.model import (
    CHECKPOINTS,
    MISSING,
    QUANTIZATION,
    StandInConfig,
    StandInModelConfig,
    mla_architectures,
)
from sglpatch.doctor.resolve.msgspec_stand_in import field_defaults
from sglpatch.doctor.resolve.sandbox import Sandbox
from sglpatch.doctor.resolve.stand_ins import CONSULTED, Capability, Unknown

# The ServerArgs fields the census reads back, by kind of the kernel-support table.
FIELDS: dict[str, tuple[str, ...]] = {
    "attention": ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
    "dsa": ("nsa_prefill_backend", "nsa_decode_backend", "dsa_prefill_backend",
            "dsa_decode_backend"),
    "moe": ("moe_runner_backend",),
    "gemm": ("fp8_gemm_runner_backend", "fp4_gemm_runner_backend"),
}  # fmt: skip
# Fields read beside the backends, for the patches whose code depends on them (`Concerns.unless`:
# 0.5.23 resolves the DSA KV cache to fp8_e4m3 on 12 by itself).
SETTINGS = ("kv_cache_dtype",)
# Fields that turn a kernel on by themselves (kind, the kernel table's name), and at which
# tensor-parallel size it runs: 0.5.4.post2 - 0.5.7 turn the FlashInfer all-reduce fusion on for
# 12, which only all-reduces across GPUs.
SWITCHES: dict[str, tuple[str, str]] = {
    "enable_flashinfer_allreduce_fusion": ("comm", "flashinfer_allreduce_fusion"),
}
# The steps that resolve those defaults, in __post_init__'s (or the pipeline's) order: a
# ServerArgs method `_handle_<step>` (to 0.5.18) or a hook `handle_<step>` in arg_groups (0.5.19+).
STEPS = (
    # Sets fields the later steps read (e.g. 0.5.16's quantization opt-out).
    "missing_default_values",
    "cuda_graph_config",  # 0.5.16+: the DeepSeek branch reads the parsed CUDA-graph config
    "model_specific_adjustments",
    "attention_backend_compatibility",
    "moe_kernel_config",
)


@functools.lru_cache(maxsize=8)
def hook_modules(files: ReleaseFiles) -> dict[str, str]:
    """0.5.19+: the arg_groups module defining each `handle_<step>` hook."""
    found: dict[str, str] = {}
    for path in files.below("sglang/srt/arg_groups/"):
        text = files.read(path).decode(errors="replace")
        for step in STEPS:
            if f"\ndef handle_{step}(" in text:
                found.setdefault(step, path[:-3].replace("/", "."))
    return found


# Errors the release's own checks raise to refuse a configuration at start-up.
REFUSALS = (AssertionError, ValueError, NotImplementedError, RuntimeError)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one release resolves for one model on one device."""

    choices: tuple[tuple[str, str, str], ...] = ()  # (kind, field, value), set fields only
    refused: str | None = None  # the release's own start-up error, if it raised one
    not_evaluated: str | None = None  # why the stand-ins could not run it to a result
    # Where the release's code last set each chosen field (field, sglang/... file, line); a
    # field set through 0.5.19+'s declarations is not traced.
    where: tuple[tuple[str, str, int], ...] = ()
    refused_at: tuple[str, int] | None = None  # the release's line that raised the refusal
    # The model's attributes the release asked for and the stand-in config lacked
    # ("hf_config.learnable_sink"): where the code had a default, it took it.
    absent: tuple[str, ...] = ()
    # The same refusal on a reference GPU (10.0): the launch needs a flag everywhere, which is
    # no capability-12 gap (set by `survey`).
    refused_on_reference: bool = False
    # The release never read the checkpoint's quantization: the model's other checkpoints
    # (the same fields, another quantization) get this outcome too.
    quantization_unread: bool = False
    settings: tuple[tuple[str, str], ...] = ()  # `SETTINGS` as resolved (field, value)


class Resolver:
    """One release's modules on one stand-in device (build once, evaluate many models)."""

    def __init__(
        self, files: ReleaseFiles, capability: Capability, replaced: Mapping[str, bytes] = {}
    ) -> None:
        self.files = files
        self.capability = capability
        self._current: StandInModelConfig | None = None
        self.sandbox = Sandbox(files, capability, replaced, model=self._model)

    def _model(self) -> StandInModelConfig | None:
        return self._current

    def evaluate(
        self,
        arch: str,
        quantization: str,
        extra: Mapping[str, Any] = {},
        flags: Mapping[str, object] = {},
    ) -> Outcome:
        """One architecture in one of `CHECKPOINTS`' quantizations, with `extra` hf_config
        attributes, launched with `flags` (ServerArgs fields; the rest take their defaults)."""
        quantization_config, resolved = CHECKPOINTS[quantization]
        hf: dict[str, Any] = {"architectures": [arch], "model_type": "stand-in", **extra}
        if quantization_config is not None:
            hf["quantization_config"] = dict(quantization_config)
        return self.evaluate_config(hf, resolved, flags)

    def evaluate_config(
        self, hf: Mapping[str, Any], quantization: str | None, flags: Mapping[str, object] = {}
    ) -> Outcome:
        """A checkpoint's config.json (its `architectures` first), with the quantization
        SGLang's ModelConfig resolves it to, launched with `flags`."""
        with self.sandbox.active():
            try:
                outcome = self._evaluate(hf, quantization, flags)
                unread = QUANTIZATION.recording and not QUANTIZATION.names
                return dataclasses.replace(outcome, quantization_unread=unread)
            finally:
                CONSULTED.recording = MISSING.recording = QUANTIZATION.recording = False

    def _evaluate(
        self, hf: Mapping[str, Any], quantization: str | None, flags: Mapping[str, object]
    ) -> Outcome:
        server_args_module = importlib.import_module("sglang.srt.server_args")
        arch_enum = importlib.import_module("sglang.srt.configs.model_config").AttentionArch
        arch = next(iter(hf.get("architectures") or [""]))
        self._current = StandInModelConfig(
            StandInConfig(**hf), quantization, arch in mla_architectures(self.files), arch_enum
        )
        QUANTIZATION.names.clear()
        QUANTIZATION.recording = True  # to the end of the evaluation, whoever reads it
        cls = server_args_module.ServerArgs
        args = cls.__new__(cls)
        defaults = field_defaults(cls)
        given = {name: value for name, value in flags.items() if name in defaults}
        _fill(
            args,
            {
                **defaults,
                **given,
                "model_path": "stand-in/model",
                "device": "cuda",
                "model_config": self._current,  # 0.5.3-0.5.18: get_model_config() memo
                "_model_config": self._current,  # 0.5.19+: model_config_of() memo
                "_resolved_overrides": [],
            },
        )
        where = _WHERE
        where.clear()
        with contextlib.suppress(TypeError):  # a class whose layout forbids it: not traced
            args.__class__ = _traced(cls)
        if self.files.exists(_OVERRIDES_FILE):  # 0.5.16+: model overrides declare, not set
            _trace_providers(importlib.import_module(_OVERRIDES))
        CONSULTED.names.clear()
        MISSING.names.clear()
        CONSULTED.recording = MISSING.recording = True
        refused = refused_at = None
        try:
            hooks = hook_modules(self.files)
            for step in STEPS:
                method = getattr(cls, f"_handle_{step}", None)
                if method is not None:
                    method(args)
                elif step in hooks:
                    getattr(importlib.import_module(hooks[step]), f"handle_{step}")(args)
        except REFUSALS as error:
            if not _raised_by_release(error):
                return Outcome(not_evaluated=f"{type(error).__name__}: {error}")
            refused = f"{type(error).__name__}: {_first_line(error)}"
            refused_at = _raised_at(error)
        except Exception as error:  # a stand-in the code reached beyond
            return Outcome(not_evaluated=_why(error))
        finally:
            CONSULTED.recording = MISSING.recording = False
        overrides = sys.modules.get("sglang.srt.arg_groups.overrides")
        materialize = getattr(overrides, "materialize_declarations", None)
        if materialize is not None and not isinstance(materialize, Unknown):
            materialize(args)
        if CONSULTED.names:
            return Outcome(not_evaluated="decided with stand-in " + ", ".join(CONSULTED.names))
        # 0.5.19+ keep the resolution as declarations: read them as SGLang's projection does.
        result = getattr(overrides, "resolution_result", None)
        read: Callable[[str], Any] = (
            (lambda name: getattr(args, name, None))
            if result is None or isinstance(result, Unknown)
            else (lambda name: result(args, name) if hasattr(args, name) else None)
        )
        choices = []
        for kind, names in FIELDS.items():
            for name in names:
                value = read(name)
                if isinstance(value, str):
                    choices.append((kind, name, value))
                elif value is not None:
                    return Outcome(not_evaluated=f"{name} resolved to {value!r}")
        if _tensor_parallel(read("tp_size")):
            choices += [(k, f, kernel) for f, (k, kernel) in SWITCHES.items() if read(f) is True]
        traced = tuple((name, *where[name]) for _, name, _ in choices if name in where)
        settings = tuple((name, value) for name in SETTINGS if isinstance(value := read(name), str))
        return Outcome(
            tuple(choices),
            refused,
            where=traced,
            refused_at=refused_at,
            absent=tuple(MISSING.names),
            settings=settings,
        )


def _fill(args: object, values: dict[str, Any]) -> None:
    """Sets the fields as `object.__setattr__` would, in one step where the instance keeps them
    in its `__dict__` (four hundred fields, for every checkpoint)."""
    kind: type = type(args)
    setters = _setters(kind)
    held = getattr(args, "__dict__", None)
    if held is None:
        setters = frozenset(values)
    else:
        held.update((name, value) for name, value in values.items() if name not in setters)
    for name in setters & values.keys():
        object.__setattr__(args, name, values[name])


@functools.lru_cache(maxsize=16)
def _setters(cls: type) -> frozenset[str]:
    """The names `cls` sets through a descriptor (a property, a slot), not its `__dict__`."""
    return frozenset(
        name for klass in cls.__mro__ for name, value in vars(klass).items()
        if hasattr(type(value), "__set__")
    )  # fmt: skip


# 0.5.16+ functions that copy declared values onto the fields: not where a choice is made.
_COPIERS = frozenset({"materialize_declarations", "_apply_fields"})
_WATCHED = frozenset(name for names in FIELDS.values() for name in names) | SWITCHES.keys()


def _tensor_parallel(size: object) -> bool:
    return type(size) is int and size > 1  # not a stand-in's value


_WHERE: dict[str, tuple[str, int]] = {}  # the evaluation under way's (one at a time)


_OVERRIDES = "sglang.srt.arg_groups.overrides"
_OVERRIDES_FILE = "sglang/srt/arg_groups/overrides.py"


def _trace_providers(overrides: Any) -> None:
    """0.5.16+ collect each model override's declarations through `_invoke_provider(fn, ...)`:
    note in `_WHERE` the override function that declares each field the census reads (its
    first line), since the fields are set later by a copier."""
    real = vars(overrides).get("_invoke_provider")
    if real is None or getattr(real, "_sglpatch_traced", False):
        return

    def traced(fn: Any, *args: Any, **kwargs: Any) -> Any:
        declared = real(fn, *args, **kwargs)
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename.startswith("sglang/"):
            for name in set(declared) & _WATCHED if isinstance(declared, dict) else ():
                _WHERE[name] = (code.co_filename, code.co_firstlineno)
        return declared

    traced._sglpatch_traced = True  # type: ignore[attr-defined]
    overrides._invoke_provider = traced


@functools.lru_cache(maxsize=16)
def _traced(cls: type) -> type:
    """`cls` noting in `_WHERE` the release's line that sets each field the census reads (one
    class per release: a new class per evaluation would empty Python's method caches)."""

    class Traced(cls):  # type: ignore[misc]
        def __setattr__(self, name: str, value: Any) -> None:
            if name in _WATCHED:
                frame = sys._getframe(1)
                code = frame.f_code
                if code.co_filename.startswith("sglang/") and code.co_name not in _COPIERS:
                    _WHERE[name] = (code.co_filename, frame.f_lineno)
            super().__setattr__(name, value)

    traced: type = Traced
    traced.__module__ = cls.__module__
    traced.__qualname__ = cls.__qualname__
    return traced


def _raised_at(error: BaseException) -> tuple[str, int] | None:
    trace = error.__traceback__
    found = None
    while trace is not None:
        if trace.tb_frame.f_code.co_filename.startswith("sglang/"):
            found = (trace.tb_frame.f_code.co_filename, trace.tb_lineno)
        trace = trace.tb_next
    return found


def _raised_by_release(error: BaseException) -> bool:
    """The error's innermost frame is in one of the release's own files."""
    trace = error.__traceback__
    last = None
    while trace is not None:
        last = trace.tb_frame.f_code.co_filename
        trace = trace.tb_next
    return bool(last and last.startswith("sglang/"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


def _why(error: BaseException) -> str:
    at = _raised_at(error)
    where = f" ({at[0]}:{at[1]})" if at else ""
    return f"{type(error).__name__}: {_first_line(error)}{where}"
