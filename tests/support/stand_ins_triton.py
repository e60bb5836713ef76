"""Run SGLang's Triton attention launchers without a GPU, and compile its kernels for sm_120.

Two levels, for the two Triton block-size patches:

- `choice(...)`: the release's own choosing code (a launcher, or the helper it calls) is cut out
  of the (patched) source and executed alone with stand-ins for the globals it reads
  (`_is_cuda`, `_is_hip`, `CUDA_CAPABILITY`, `triton`) and a recorder in place of the kernel
  launch. No Triton, no torch: cheap enough for the release matrix.
- `Kernels` and `shared_memory(...)`: the whole module is loaded from a real file (Triton's `jit`
  reads the kernel's source through `inspect`) with real Triton and stand-in torch and SGLang
  modules, its launcher runs on fake tensors under a stand-in capability, and the release's own
  `@triton.jit` kernel is compiled for sm_120 with exactly the constexprs, warps and stages the
  launcher chose. `compiled.metadata.shared` is the shared memory the launch asks for; the launch
  fails when it exceeds the device's limit.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

# The "Hardware limit" in the published crash: the opt-in shared memory per block of sm_120/121.
SM120_SHARED_MEMORY = 101376
CAPABILITY_12 = ((12, 0), (12, 1))
# A backport changes capability 12 only: these must choose exactly what they chose before.
OTHER_CAPABILITIES = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3))


class FakeTensor:
    """Shape, dtype and contiguous strides: all a launcher reads from its tensors."""

    def __init__(self, *shape: int, dtype: str = "bf16") -> None:
        self.shape = shape
        self.dtype = dtype

    def stride(self, dim: int) -> int:
        step = 1
        for size in self.shape[dim + 1 :]:
            step *= size
        return step


class Launch(NamedTuple):
    """One `kernel[grid](*args, **kwargs)` call as the launcher made it."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Recorder:
    """Stands in for a `@triton.jit` kernel: `kernel[grid](...)` records the call."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []

    def __getitem__(self, grid: object) -> Any:
        return lambda *args, **kwargs: self.launches.append(Launch(args, kwargs))


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


_TRITON = types.SimpleNamespace(
    next_power_of_2=_next_power_of_2, cdiv=lambda a, b: -(-a // b), __version__="3.9.0"
)


@cache
def functions(source: bytes) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def run_alone(
    source: bytes,
    names: tuple[str, ...],
    capability: tuple[int, int],
    *,
    hip: bool = False,
) -> tuple[dict[str, Any], _Recorder]:
    """Execute only the module-level functions `names` of `source`, with stand-in globals."""
    recorder = _Recorder()
    namespace: dict[str, Any] = {
        "__builtins__": builtins,
        "triton": _TRITON,
        "_is_cuda": not hip,
        "_is_hip": hip,
        "CUDA_CAPABILITY": capability,
        "_fwd_kernel": recorder,
    }
    exec(_cut_out(source, names), namespace)
    return namespace, recorder


@cache
def _cut_out(source: bytes, names: tuple[str, ...]) -> types.CodeType:
    """The functions `names` of `source`, compiled alone (parsed once per source)."""
    text = source.decode()
    tree = ast.parse(text)
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    assert set(found) == set(names), f"missing {set(names) - set(found)}"
    code = "\n\n".join(ast.get_source_segment(text, found[name]) or "" for name in names)
    return compile(code, "<launcher>", "exec")


# What the extend launcher's chooser returns, in its order.
EXTEND_CHOICE = ("BLOCK_DMODEL", "BLOCK_DPE", "BLOCK_DV", "BLOCK_M", "BLOCK_N", "num_warps")
EXTEND_CHOOSER = "_get_block_sizes_for_extend_attention"


def extend_args(lq: int, lv: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`extend_attention_fwd`'s arguments for one prefill: 4 sequences, 16 heads, 1 KV head."""
    tokens, heads, kv_heads, batch = 4096, 16, 1, 4
    q, o = FakeTensor(tokens, heads, lq), FakeTensor(tokens, heads, lv)
    k, v = FakeTensor(tokens, kv_heads, lq), FakeTensor(tokens, kv_heads, lv)
    k_buffer, v_buffer = FakeTensor(65536, kv_heads, lq), FakeTensor(65536, kv_heads, lv)
    indptr = FakeTensor(batch + 1, dtype="i32")
    indices = FakeTensor(65536, dtype="i32")
    args = (q, k, v, o, k_buffer, v_buffer, indptr, indptr, indices, None, True, None, 1024)
    return args, {}


def unified_args(lq: int, lv: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`extend_attention_fwd_unified`'s (0.5.4 on, deterministic inference): the same prefill."""
    (q, _, _, o, k_buffer, v_buffer, indptr, _, indices, *_), _ = extend_args(lq, lv)
    prefix_lens = FakeTensor(indptr.shape[0] - 1, dtype="i32")
    return (q, o, k_buffer, v_buffer, indptr, indptr, indices, prefix_lens, 1024), {}


def extend_choice(source: bytes, capability: tuple[int, int], lq: int, lv: int) -> tuple[Any, ...]:
    """What the release's own code picks for (Lq, Lv): the chooser from 0.5.4, else the launcher."""
    if EXTEND_CHOOSER in functions(source):
        namespace, _ = run_alone(source, (EXTEND_CHOOSER,), capability)
        return tuple(namespace[EXTEND_CHOOSER](lq, lv))
    namespace, recorder = run_alone(source, ("extend_attention_fwd",), capability)
    args, kwargs = extend_args(lq, lv)
    namespace["extend_attention_fwd"](*args, **kwargs)
    (launch,) = recorder.launches
    return tuple(launch.kwargs[name] for name in EXTEND_CHOICE)


def prefill_args(head_dim: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`context_attention_fwd`'s arguments: 4 sequences, 16 heads, 4 KV heads."""
    tokens, batch = 4096, 4
    q, o = FakeTensor(tokens, 16, head_dim), FakeTensor(tokens, 16, head_dim)
    k, v = FakeTensor(tokens, 4, head_dim), FakeTensor(tokens, 4, head_dim)
    starts, lengths = FakeTensor(batch, dtype="i32"), FakeTensor(batch, dtype="i32")
    return (q, k, v, o, starts, lengths, 1024), {}


def prefill_choice(
    source: bytes, capability: tuple[int, int], head_dim: int, *, hip: bool = False
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) that `context_attention_fwd` launches with."""
    namespace, recorder = run_alone(source, ("context_attention_fwd",), capability, hip=hip)
    args, kwargs = prefill_args(head_dim)
    namespace["context_attention_fwd"](*args, **kwargs)
    (launch,) = recorder.launches
    return launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"]


# ---- whole modules with real Triton -------------------------------------------------------

_WORK = Path(tempfile.mkdtemp(prefix="sglpatch-triton-"))
atexit.register(shutil.rmtree, _WORK, True)


class _Anything(types.ModuleType):
    """A stand-in module: any attribute is a fresh class, usable as an annotation or a value."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


@contextmanager
def _stand_in_imports(capability: tuple[int, int]) -> Iterator[None]:
    """torch and SGLang as seen on a CUDA device of `capability`; Triton is the real one."""
    torch = _Anything("torch")
    torch.cuda = types.SimpleNamespace(get_device_capability=lambda: capability)  # type: ignore[attr-defined]
    # Double sparsity's module decorates its launchers with `@torch.no_grad()`.
    torch.no_grad = lambda: lambda function: function  # type: ignore[attr-defined]
    utils = _Anything("sglang.srt.utils")
    utils.is_cuda = lambda: True  # type: ignore[attr-defined]
    utils.is_hip = lambda: False  # type: ignore[attr-defined]
    # ... and reads one server argument at import, from 0.5.3.post2 through the global accessor.
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.get_global_server_args = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        triton_attention_reduce_in_fp32=False
    )
    schedule_batch = types.ModuleType("sglang.srt.managers.schedule_batch")
    schedule_batch.global_server_args_dict = {}  # type: ignore[attr-defined]
    fakes: dict[str, types.ModuleType] = {
        "torch": torch,
        "sglang.srt.utils": utils,
        server_args.__name__: server_args,
        schedule_batch.__name__: schedule_batch,
    }
    for package in ("srt.layers.attention.triton_ops", "kernels.ops.attention"):
        name = f"sglang.{package}.prefill_attention"
        fakes[name] = _Anything(name)
    saved = {name: sys.modules.get(name) for name in fakes}
    sys.modules.update(fakes)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_module(source: bytes, capability: tuple[int, int]) -> types.ModuleType:
    """The module `source`, executed from a real file as it would be on `capability`."""
    digest = hashlib.sha256(source).hexdigest()[:16]
    path = _WORK / f"attention_{digest}.py"
    if not path.exists():
        path.write_bytes(source)
    name = f"_sglpatch_attention_{digest}_{capability[0]}{capability[1]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _stand_in_imports(capability):
        spec.loader.exec_module(module)
    return module


def launch(
    source: bytes,
    capability: tuple[int, int],
    launcher: str,
    arguments: tuple[tuple[Any, ...], dict[str, Any]],
    kernel_name: str = "_fwd_kernel",
) -> tuple[Any, Launch]:
    """Run the whole module's `launcher` on `capability`: (its real kernel, the launch)."""
    module = load_module(source, capability)
    kernel = getattr(module, kernel_name)
    recorder = _Recorder()
    setattr(module, kernel_name, recorder)
    args, kwargs = arguments
    getattr(module, launcher)(*args, **kwargs)
    (call,) = recorder.launches
    return kernel, call


class Compiled(NamedTuple):
    shared: int
    constexprs: Mapping[str, Any]
    num_warps: int
    num_stages: int


_COMPILED: dict[tuple[Any, ...], Compiled] = {}


def _value_type(value: object) -> str:
    if isinstance(value, FakeTensor):
        return f"*{value.dtype}"
    if isinstance(value, float):
        return "fp32"
    assert isinstance(value, int) and not isinstance(value, bool), value
    return "i32"


def shared_memory(kernel: Any, call: Launch, *, aligned: bool = False) -> Compiled:
    """Compile `kernel` for sm_120 as `call` launches it; cached by (kernel source, launch).

    `aligned`: its tensor arguments are 16-byte aligned, as Triton's launcher specializes them
    for every torch allocation (`tt.divisibility = 16`). Without it the loads of a GEMM whose
    pointers Triton cannot prove aligned are not software-pipelined, and `num_stages` buys no
    shared memory: the figure would be one stage's, not the launch's.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {
        k: call.kwargs.get(k, default) for k, default in (("num_warps", 4), ("num_stages", 3))
    }
    bound = dict(zip((p.name for p in kernel.params), call.args, strict=False))  # then kwargs
    bound.update({k: v for k, v in call.kwargs.items() if k not in options})
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for param in kernel.params:
        value = bound[param.name]
        # Triton's launcher treats None arguments as constexprs too.
        if param.is_constexpr or value is None:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        else:
            signature[param.name] = _value_type(value)
    attrs = {
        (index,): [["tt.divisibility", 16]]
        for index, param in enumerate(kernel.params)
        if aligned and signature[param.name].startswith("*")
    }
    key = (
        _source_key(kernel),
        tuple(signature.items()),
        tuple(constexprs.items()),
        *options.values(),
        aligned,
    )
    if key not in _COMPILED:
        with _environment(TRITON_CACHE_DIR=str(_WORK / "cache"), TRITON_DEFAULT_FP_FUSION="1"):
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                target=GPUTarget("cuda", 120, 32),
                options=options,
            )
        _COMPILED[key] = Compiled(
            compiled.metadata.shared, constexprs, options["num_warps"], options["num_stages"]
        )
    return _COMPILED[key]


def _source_key(kernel: Any) -> str:
    """A digest of the kernel's source, the jit functions it calls and the constants it reads.

    Not Triton's `cache_key`: that also hashes where the kernel starts in its file, so the same
    kernel in a patched file (a few lines further down) or in another release would compile again.
    """
    from triton.runtime.jit import JITFunction

    digest = hashlib.sha256()
    seen: set[int] = set()
    pending = [kernel]
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        digest.update(function.src.encode())
        module_globals = function.fn.__globals__
        for name in sorted(function.fn.__code__.co_names):
            value = module_globals.get(name)
            if isinstance(value, JITFunction):
                pending.append(value)
            elif isinstance(value, (bool, int, float, str)):
                digest.update(f"{name}={value!r}".encode())
    return digest.hexdigest()


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """A fresh cache (every figure is compiled in this run, nothing read from ~/.triton) and
    Triton 3.9's default FP fusion said out loud (it warns otherwise; shared memory is the same)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
