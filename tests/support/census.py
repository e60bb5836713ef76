"""Run a release's own ServerArgs resolution for one architecture on a stand-in device.

The census (scripts/sm120_census.py, tests/test_census.py) asks each release which attention,
DSA, MoE and GEMM backends its default-flag resolution gives a model architecture on capability
12.0, 12.1 and 10.0. Nothing here imports torch or SGLang. A *sandbox* serves the release's
modules from its wheel:

- the modules that make the choice run whole, from their source (possibly patched in memory):
  `srt/server_args.py`, everything under `srt/arg_groups/`, `srt/environ.py`;
- every other SGLang module is *lifted*: a name is defined, on first use, by running the
  statement of the real module that defines it (and, first, those its free names need), so
  `is_deepseek_nsa`, `AttentionArch` or `get_platform` are the release's own code. The
  capability probes in `srt/utils/common.py` run against a stand-in `torch.cuda` reporting the
  chosen capability (as tests/support/stand_ins_gemm.py does);
- torch and every third-party module are stand-ins whose unknown attributes are `Unknown`
  values. An `Unknown` that the code under test *decides with* (truth value, comparison,
  iteration) is logged, and a result that depended on one is reported as not evaluated, never
  as a choice.

The model is a stand-in `ModelConfig`: its hf_config has the architecture, the checkpoint's
`quantization_config` and the attributes a variant names (`index_topk` for DSA); its
`attention_arch` is MLA when the release's own ModelConfig lists the architecture as MLA.
A model attribute the stand-in does not carry raises, and the row says which one.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tests.support import syntax, wheels

Capability = tuple[int, int]

# Modules run whole: the resolution itself.
RUN_WHOLE = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.environ")
# Third-party modules imported for real (pure Python, installed in the dev environment).
REAL_THIRD_PARTY = ("packaging", "typing_extensions")
COMMON = "sglang.srt.utils.common"
MODEL_CONFIG = "sglang/srt/configs/model_config.py"

# What a device of each capability is called (SGLang reads the name for a few H20 checks).
DEVICE_NAMES = {
    (8, 9): "NVIDIA L40S",
    (9, 0): "NVIDIA H100 80GB HBM3",
    (10, 0): "NVIDIA B200",
    (12, 0): "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    (12, 1): "NVIDIA GB10",
}


class NotEvaluated(Exception):
    """The release's code could not be run to a result on the stand-ins (the reason says why)."""


class Consulted:
    """The names of stand-in values the code under test decided with, while it is recording."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.recording = False

    def note(self, name: str) -> None:
        if self.recording and name not in self.names:
            self.names.append(name)


CONSULTED = Consulted()


class Unknown:
    """A stand-in for something a third-party or unlifted module holds.

    Using it as a decorator hands the function back; calling it or reading an attribute gives
    another `Unknown`; deciding with it (bool, ==, <, in, iteration, len) is logged.
    """

    __slots__ = ("_name",)
    _name: str  # set once, in __init__ (setting an attribute is a no-op on a stand-in)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"

    def __getattr__(self, attribute: str) -> Unknown:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return Unknown(f"{self._name}.{attribute}")

    def __setattr__(self, attribute: str, value: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return args[0]
        return Unknown(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __getitem__(self, key: Any) -> Unknown:
        return Unknown(f"{self._name}[]")

    def __bool__(self) -> bool:
        CONSULTED.note(self._name)
        return False

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Unknown, type)):  # typing deduplicating Union args, not a choice
            return self is other
        CONSULTED.note(self._name)
        return False

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: object) -> bool:
        CONSULTED.note(self._name)
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __hash__(self) -> int:
        return id(self)

    def __iter__(self) -> Iterator[Any]:
        CONSULTED.note(self._name)
        return iter(())

    def __contains__(self, item: object) -> bool:
        CONSULTED.note(self._name)
        return False

    def __len__(self) -> int:
        CONSULTED.note(self._name)
        return 0

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __or__(self, other: Any) -> Any:  # `int | None` in a signature evaluated at import
        return self

    __ror__ = __or__


class _StandInModule(types.ModuleType):
    """A third-party module: every attribute is an `Unknown`."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return Unknown(f"{self.__name__}.{attribute}")


def stand_in_torch(capability: Capability) -> types.ModuleType:
    torch = _StandInModule("torch")
    torch.__path__ = []
    torch.__version__ = "2.9.1+cu129"  # type: ignore[attr-defined]
    cuda = _StandInModule("torch.cuda")
    cuda.is_available = lambda: True  # type: ignore[attr-defined]
    cuda.is_initialized = lambda: True  # type: ignore[attr-defined]
    cuda.device_count = lambda: 1  # type: ignore[attr-defined]
    cuda.get_device_capability = lambda device=None: capability  # type: ignore[attr-defined]
    cuda.get_device_name = lambda device=None: DEVICE_NAMES[capability]  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    for other in ("cpu", "xpu", "npu", "mps", "musa", "hpu"):
        absent = _StandInModule(f"torch.{other}")
        absent.is_available = lambda: False  # type: ignore[attr-defined]
        setattr(torch, other, absent)
    torch.backends = _StandInModule("torch.backends")  # type: ignore[attr-defined]
    torch.backends.mps = torch.mps
    torch.version = types.SimpleNamespace(cuda="12.9", hip=None, xpu=None)  # type: ignore[attr-defined]
    return torch


def _defines(statement: ast.stmt) -> set[str]:
    """The module-level names one top-level statement binds."""
    names: set[str] = set()
    nodes: list[ast.AST] = [statement]
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        nodes.extend(ast.iter_child_nodes(node))
    return names


def _loads(statement: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)}


@functools.cache
def _index(source: bytes) -> tuple[ast.Module, dict[str, list[int]]]:
    tree = syntax.tree(source)
    where: dict[str, list[int]] = {}
    for number, statement in enumerate(tree.body):
        for name in _defines(statement):
            where.setdefault(name, []).append(number)
    return tree, where


class LiftedModule(types.ModuleType):
    """An SGLang module whose names are defined on first use from its real source."""

    def __init__(
        self, name: str, source: bytes, sandbox: Sandbox, preset: Mapping[str, Any]
    ) -> None:
        super().__init__(name)
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_done", set())
        self.__dict__.update(preset)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        tree, where = _index(self._source)
        if attribute in where:
            self._run(where[attribute], tree, set())
            if attribute in self.__dict__:
                return self.__dict__[attribute]
        submodule = self._sandbox.submodule(self.__name__, attribute)
        if submodule is not None:
            return submodule
        return Unknown(f"{self.__name__}.{attribute}")

    def _run(self, numbers: list[int], tree: ast.Module, seen: set[int]) -> None:
        """Run the statements defining a name: first those the definition itself needs (a base
        class, a decorator, a default), then it, then those its function bodies will read."""
        _, where = _index(self._source)
        for number in numbers:
            if number in self._done or number in seen:
                continue
            seen.add(number)
            statement = tree.body[number]
            now, later = _needs(statement)
            own = _defines(statement)
            for free in sorted(now - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], tree, seen)
            self._done.add(number)
            module = ast.Module(body=[statement], type_ignores=[])
            try:
                exec(compile(module, self.__file__ or self.__name__, "exec"), self.__dict__)
            except Exception as error:  # a conditional import or a probe of absent hardware
                logging.getLogger("sglpatch.census").debug(
                    "%s: statement %d: %s", self.__name__, number, error
                )
            for free in sorted(later - own):
                if free in where and free not in self.__dict__:
                    self._run(where[free], tree, set())


def _needs(statement: ast.stmt) -> tuple[set[str], set[str]]:
    """The names a statement reads when it runs, and those only its function bodies read."""
    now: set[str] = set()
    later: set[str] = set()

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            head: list[ast.AST] = [*node.args.defaults, *node.args.kw_defaults]  # type: ignore[list-item]
            if not isinstance(node, ast.Lambda):
                head += node.decorator_list
            for part in head:
                if part is not None:
                    visit(part, deferred)
            body = node.body if isinstance(node.body, list) else [node.body]
            for part in body:
                visit(part, True)
            return
        if isinstance(node, ast.Name):
            (later if deferred else now).add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, deferred)

    visit(statement, False)
    return now, later - now


# Import names of requirements whose distribution is named otherwise.
_IMPORT_NAMES = {"flashinfer_python": "flashinfer", "sglang_kernel": "sgl_kernel",
                 "nvidia_cutlass_dsl": "cutlass", "pillow": "PIL", "pyyaml": "yaml"}  # fmt: skip


@functools.cache
def _installed(release: str) -> frozenset[str]:
    """The top-level modules an install of `release` has: its unconditional requirements
    (the wheel's METADATA) and torch."""
    import re

    (metadata,) = [n for n in wheels.members(release, "") if n.endswith(".dist-info/METADATA")]
    names = {"torch", "triton", "transformers", "sgl_kernel", "flashinfer"}
    for line in wheels.member(release, metadata).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            found = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)", line)
            if found:
                name = re.sub(r"[-.]", "_", found.group(1)).lower()
                names.add(_IMPORT_NAMES.get(name, name))
    return frozenset(names)


class Sandbox(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The modules of one release, on one stand-in device, with some files replaced."""

    def __init__(
        self,
        release: str,
        capability: Capability,
        replaced: Mapping[str, bytes] = {},
        model: Callable[[], Any] | None = None,
    ) -> None:
        self.release = release
        self.capability = capability
        self.replaced = dict(replaced)
        self.model = model
        self.files = set(wheels.members(release))
        self.installed = _installed(release)
        self.kept: dict[str, types.ModuleType] = {}

    # The wheel's files.
    def _file(self, name: str) -> tuple[str, bool] | None:
        path = name.replace(".", "/")
        if f"{path}/__init__.py" in self.files:
            return f"{path}/__init__.py", True
        if f"{path}.py" in self.files:
            return f"{path}.py", False
        return None

    def source(self, path: str) -> bytes:
        return self.replaced.get(path) or wheels.member(self.release, path)

    def submodule(self, package: str, name: str) -> types.ModuleType | None:
        if self._file(f"{package}.{name}") is None:
            return None
        return importlib.import_module(f"{package}.{name}")

    # The import system's side.
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        root = fullname.split(".")[0]
        if root in sys.stdlib_module_names or root in REAL_THIRD_PARTY:
            return None
        if root != "sglang" and root not in self.installed:
            return None  # not installed with SGLang: the import fails as it would there
        found = self._file(fullname) if root == "sglang" else None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=bool(found and found[1]) or found is None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name == "torch":
            module: types.ModuleType = stand_in_torch(self.capability)
        elif name.startswith("torch."):
            module = getattr(sys.modules["torch"], name.split(".", 1)[1], None) or (
                _StandInModule(name)
            )
            if not isinstance(module, types.ModuleType):
                module = _StandInModule(name)
        elif name in ("msgspec", "msgspec.structs"):
            module = _msgspec() if name == "msgspec" else sys.modules["msgspec"].structs
        elif name == "sglang.srt.platforms":
            module = types.ModuleType(name)
            module.current_platform = _CudaPlatform()  # type: ignore[attr-defined]
        elif name.split(".")[0] != "sglang" or self._file(name) is None:
            module = _StandInModule(name)
        elif _run_whole(name):
            module = types.ModuleType(name)
        else:
            path, _ = self._file(name)  # type: ignore[misc]
            preset = {"__file__": path, "__name__": name}
            if name == COMMON and "sglang.srt.utils" in sys.modules:
                return sys.modules["sglang.srt.utils"]
            if name == "sglang.srt.utils":  # its __init__ re-exports common: one module for both
                path = COMMON.replace(".", "/") + ".py"
                preset = {"__file__": path, "__name__": name} | self._common_preset()
            if name == "sglang.srt.configs.model_config" and self.model is not None:
                model = self.model
                preset["ModelConfig"] = type(
                    "ModelConfig", (), {"from_server_args": staticmethod(lambda *a, **k: model())}
                )
            module = LiftedModule(name, self.source(path), self, preset)
            if name == "sglang.srt.utils":
                module.__path__ = []
                return module
        found = self._file(name)
        if found is not None:
            module.__file__ = found[0]
        if found is None or found[1]:
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if _run_whole(name) and not isinstance(module, (LiftedModule, _StandInModule)):
            path = module.__file__ or ""
            code = compile(self.source(path), path, "exec")
            exec(code, module.__dict__)

    def _common_preset(self) -> dict[str, Any]:
        from tests.support import stand_ins_gemm

        capability = self.capability
        return {
            **stand_ins_gemm._STUBBED,
            "is_flashinfer_available": lambda: True,  # every wheel requires flashinfer_python
            "is_triton_kernels_available": lambda: True,
            "get_device_name": lambda device_id=0: DEVICE_NAMES[capability],
            "get_nvidia_driver_version": lambda: (580, 0),
            "check_pkg_version_at_least": lambda pkg, version: True,
            "get_device_memory_capacity": lambda device=None: 96 * 1024,
            "is_host_cpu_arm64": lambda: capability == (12, 1),
            "use_mlx": lambda: False,
        }

    @contextmanager
    def active(self) -> Iterator[Sandbox]:
        """Serve this release's modules (kept between uses); the environment is restored after
        each use, since SGLang's `envs.X.set()` writes os.environ."""
        import os

        saved = {n: m for n, m in sys.modules.items() if n == "torch" or n.startswith(_ROOTS)}
        for name in saved:
            del sys.modules[name]
        sys.modules.update(self.kept)
        environ = dict(os.environ)
        sys.meta_path.insert(0, self)
        try:
            yield self
        finally:
            sys.meta_path.remove(self)
            os.environ.clear()
            os.environ.update(environ)
            self.kept = {n: m for n, m in list(sys.modules.items()) if _ours(m, self)}
            for name in self.kept:
                del sys.modules[name]
            sys.modules.update(saved)


def _run_whole(name: str) -> bool:
    return any(name == whole or name.startswith(whole + ".") for whole in RUN_WHOLE)


_ROOTS = ("sglang", "torch.", "flashinfer", "transformers", "triton", "sgl_kernel", "deep_gemm")


def _ours(module: Any, sandbox: Sandbox) -> bool:
    spec = vars(module).get("__spec__")  # not getattr: a lifted module would lift it
    return spec is not None and spec.loader is sandbox


class _CudaPlatform:
    """`sglang.srt.platforms.current_platform` (0.5.16+) of an NVIDIA box: SGLang's own."""

    def is_out_of_tree(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Unknown:
        return Unknown(f"current_platform.{name}")


_NODEFAULT = type("NoDefault", (), {"__repr__": lambda self: "NODEFAULT"})()


@dataclasses.dataclass(frozen=True)
class _StructField:
    name: str
    default: Any = _NODEFAULT
    default_factory: Any = _NODEFAULT
    type: Any = Any


def _msgspec() -> types.ModuleType:
    """msgspec (0.5.19+ build ServerArgs with it; not installed here): Struct, field,
    defstruct and structs.fields/asdict/replace, with msgspec's meaning for defaults."""

    class Struct:
        __struct_fields__: tuple[str, ...] = ()
        _census_fields: tuple[_StructField, ...] = ()

        def __init_subclass__(cls, **options: Any) -> None:
            found: dict[str, _StructField] = {}
            for base in reversed(cls.__mro__[1:]):
                for f in getattr(base, "_census_fields", ()):
                    found[f.name] = f
            for name, hint in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
                value = cls.__dict__.get(name, _NODEFAULT)
                if isinstance(value, _StructField):
                    found[name] = dataclasses.replace(value, name=name, type=hint)
                else:
                    found[name] = _StructField(name, value, type=hint)
            cls._census_fields = tuple(found.values())
            cls.__struct_fields__ = tuple(found)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for f, value in zip(self._census_fields, args, strict=False):
                kwargs[f.name] = value
            for f in self._census_fields:
                if f.name in kwargs:
                    value = kwargs[f.name]
                elif f.default_factory is not _NODEFAULT:
                    value = f.default_factory()
                elif f.default is not _NODEFAULT:
                    value = f.default
                else:
                    raise TypeError(f"missing {f.name}")
                object.__setattr__(self, f.name, value)

        __setattr__ = object.__setattr__

    def field(
        *, default: Any = _NODEFAULT, default_factory: Any = _NODEFAULT, name: Any = None
    ) -> _StructField:
        return _StructField("", default, default_factory)

    def defstruct(
        name: str, fields: Any, *, bases: Any = None, namespace: Any = None, **kw: Any
    ) -> type:
        body = dict(namespace or {})
        annotations = {}
        for entry in fields:
            entry = (entry,) if isinstance(entry, str) else tuple(entry)
            annotations[entry[0]] = entry[1] if len(entry) > 1 else Any
            if len(entry) > 2:
                body[entry[0]] = entry[2]
        body["__annotations__"] = annotations
        return type(name, (*(bases or ()), Struct), body)

    structs = types.ModuleType("msgspec.structs")
    structs.fields = lambda cls: (cls if isinstance(cls, type) else type(cls))._census_fields  # type: ignore[attr-defined]
    structs.asdict = lambda obj: {n: getattr(obj, n) for n in obj.__struct_fields__}  # type: ignore[attr-defined]

    def replace(obj: Any, **changes: Any) -> Any:
        return type(obj)(**{**structs.asdict(obj), **changes})

    structs.replace = replace  # type: ignore[attr-defined]
    module = types.ModuleType("msgspec")
    module.__path__ = []
    module.__dict__.update(
        Struct=Struct, field=field, defstruct=defstruct, structs=structs, NODEFAULT=_NODEFAULT
    )
    return module


def field_defaults(cls: type) -> dict[str, Any]:
    """The defaults of ServerArgs' fields (a default factory is called): a dataclass to 0.5.18,
    a msgspec Struct from 0.5.19."""
    values: dict[str, Any] = {}
    if not dataclasses.is_dataclass(cls):
        for f in cls._census_fields:  # type: ignore[attr-defined]
            if f.default_factory is not _NODEFAULT:
                values[f.name] = f.default_factory()
            elif f.default is not _NODEFAULT:
                values[f.name] = f.default
        return values
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    return values


# ---------------------------------------------------------------------------------------------
# The model.

# A checkpoint's `quantization_config` (config.json) for each quantization the census asks
# about, and what SGLang's ModelConfig resolves it to (`model_config.quantization`).
CHECKPOINTS: dict[str, tuple[dict[str, Any] | None, str | None]] = {
    "bf16": (None, None),
    "fp8": (
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [128, 128]},
        "fp8",
    ),
    "modelopt_fp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt_fp4"),
    "mxfp4": ({"quant_method": "mxfp4"}, "mxfp4"),
}  # fmt: skip


class StandInConfig:
    """A Hugging Face config holding just the attributes given; others raise AttributeError."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        MISSING.note(f"hf_config.{name}")
        raise AttributeError(f"the stand-in hf_config has no {name}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def get_text_config(self) -> StandInConfig:
        return self


MISSING = Consulted()  # model attributes the code under test asked for and we do not model


class StandInModelConfig:
    """SGLang's ModelConfig for one checkpoint: the fields the resolution reads."""

    def __init__(
        self, hf_config: StandInConfig, quantization: str | None, mla: bool, arch_enum: Any
    ):
        self.hf_config = self.hf_text_config = hf_config
        self.quantization = quantization
        self.attention_arch = arch_enum.MLA if mla else arch_enum.MHA
        self.is_hybrid_swa = False
        self.is_multimodal = False
        self.is_generation = True
        self.is_encoder_decoder = False
        self.context_len = 32768
        self.num_attention_heads = 32
        self.num_key_value_heads = 8
        self.head_dim = 128
        self.dtype = "bfloat16"
        self.model_path = "stand-in"
        # ModelConfig._detect_attention_sinks (0.5.16+): GPT-OSS always has sinks.
        self.has_attention_sinks = "GptOssForCausalLM" in hf_config.architectures
        # A text-only checkpoint: ModelConfig's multimodal and decision-head fields are off.
        self.is_multimodal_piecewise_cuda_graph_supported = False
        self.decision_config = None
        self.has_asymmetric_kv = False  # K and V rows of one width (MiMoV2 is the exception)
        self.is_multimodal_gen = False
        self.is_image_gen = False
        self.is_audio_model = False

    def get_num_kv_heads(self, tp_size: int) -> int:
        return max(1, self.num_key_value_heads // tp_size)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        MISSING.note(f"model_config.{name}")
        raise AttributeError(f"the stand-in ModelConfig has no {name}")


# ---------------------------------------------------------------------------------------------
# The resolution.

# The ServerArgs fields the census reads back, by kind of the kernel-support table.
FIELDS: dict[str, tuple[str, ...]] = {
    "attention": ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
    "dsa": ("nsa_prefill_backend", "nsa_decode_backend", "dsa_prefill_backend",
            "dsa_decode_backend"),
    "moe": ("moe_runner_backend",),
    "gemm": ("fp8_gemm_runner_backend", "fp4_gemm_runner_backend"),
}  # fmt: skip
# The steps that resolve those defaults, in __post_init__'s (or the pipeline's) order: a
# ServerArgs method `_handle_<step>` (to 0.5.18) or a hook `handle_<step>` in arg_groups (0.5.19+).
STEPS = (
    "missing_default_values",  # sets fields the later steps read (e.g. 0.5.16's quantization opt-out)
    "cuda_graph_config",  # 0.5.16+: the DeepSeek branch reads the parsed CUDA-graph config
    "model_specific_adjustments",
    "attention_backend_compatibility",
    "moe_kernel_config",
)


@functools.cache
def hook_modules(release: str) -> dict[str, str]:
    """0.5.19+: the arg_groups module defining each `handle_<step>` hook."""
    found: dict[str, str] = {}
    for path in wheels.members(release, "sglang/srt/arg_groups/"):
        if not path.endswith(".py"):
            continue
        text = wheels.member(release, path).decode()
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


class Release:
    """One release's modules on one stand-in device (build once, evaluate many models)."""

    def __init__(
        self, release: str, capability: Capability, replaced: Mapping[str, bytes] = {}
    ) -> None:
        self.release = release
        self.capability = capability
        self._current: StandInModelConfig | None = None
        self.sandbox = Sandbox(release, capability, replaced, model=self._model)

    def _model(self) -> StandInModelConfig:
        assert self._current is not None
        return self._current

    def evaluate(self, arch: str, quantization: str, extra: Mapping[str, Any] = {}) -> Outcome:
        with self.sandbox.active():
            try:
                return self._evaluate(arch, quantization, extra)
            finally:
                CONSULTED.recording = MISSING.recording = False

    def _evaluate(self, arch: str, quantization: str, extra: Mapping[str, Any]) -> Outcome:
        server_args_module = importlib.import_module("sglang.srt.server_args")
        arch_enum = importlib.import_module("sglang.srt.configs.model_config").AttentionArch
        quantization_config, resolved = CHECKPOINTS[quantization]
        hf = {"architectures": [arch], "model_type": "stand-in", **extra}
        if quantization_config is not None:
            hf["quantization_config"] = dict(quantization_config)
        self._current = StandInModelConfig(
            StandInConfig(**hf), resolved, arch in mla_architectures(self.release), arch_enum
        )
        cls = server_args_module.ServerArgs
        args = cls.__new__(cls)
        for name, value in {
            **field_defaults(cls),
            "model_path": "stand-in/model",
            "device": "cuda",
            "model_config": self._current,  # 0.5.3-0.5.18: get_model_config() memo
            "_model_config": self._current,  # 0.5.19+: model_config_of() memo
            "_resolved_overrides": [],
        }.items():
            object.__setattr__(args, name, value)
        CONSULTED.names.clear()
        MISSING.names.clear()
        CONSULTED.recording = MISSING.recording = True
        refused = None
        try:
            hooks = hook_modules(self.release)
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
        return Outcome(tuple(choices), refused)


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
    where = ""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename.startswith("sglang/"):
            where = f" ({trace.tb_frame.f_code.co_filename}:{trace.tb_lineno})"
        trace = trace.tb_next
    return f"{type(error).__name__}: {_first_line(error)}{where}"


@functools.cache
def mla_architectures(release: str) -> frozenset[str]:
    """The architectures the release's ModelConfig gives `AttentionArch.MLA`: the string
    constants of each `if` whose body sets `self.attention_arch = AttentionArch.MLA`."""
    tree = syntax.tree(wheels.member(release, MODEL_CONFIG))
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        sets_mla = any(
            isinstance(s, ast.Assign)
            and isinstance(s.targets[0], ast.Attribute)
            and s.targets[0].attr == "attention_arch"
            and isinstance(s.value, ast.Attribute)
            and s.value.attr == "MLA"
            for s in node.body
        )
        if sets_mla:
            found |= {
                c.value
                for c in ast.walk(node.test)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
    return frozenset(found)
