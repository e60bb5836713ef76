"""What the sandbox hands the release instead of torch and third-party modules: `Unknown`
values that log every decision taken with them, and a stand-in torch reporting one capability."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

from sglpatch.doctor.resolve.both_parts import DIVERGED, is_both

Capability = tuple[int, int]

# What a device of each capability is called (SGLang reads the name for a few H20 checks).
DEVICE_NAMES = {
    (8, 9): "NVIDIA L40S",
    (9, 0): "NVIDIA H100 80GB HBM3",
    (10, 0): "NVIDIA B200",
    (12, 0): "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    (12, 1): "NVIDIA GB10",
}


def device_name(capability: Capability) -> str:
    """The device's name; on `BOTH`, 12.0's, with the divergence noted (GB10's differs)."""
    if is_both(capability):
        DIVERGED.seen = True
        return DEVICE_NAMES[12, 0]
    return DEVICE_NAMES[capability]


def arm64_host(capability: Capability) -> bool:
    """GB10 is an Arm machine; the other parts here sit in x86 hosts."""
    if is_both(capability):
        DIVERGED.seen = True
        return False
    return capability == (12, 1)


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

# Probes a CUDA box answers without looking at the capability: not an AMD, Intel, Moore Threads
# or Ascend part, not the CPU engine, and no NVML shortcut (the capability comes from torch.cuda).
STUBBED: dict[str, Any] = {
    "is_musa": lambda: False,
    "is_npu": lambda: False,
    "is_xpu": lambda: False,
    "is_hpu": lambda: False,
    "is_cpu": lambda: False,
    "is_fp8_fnuz": lambda: False,
    "is_gfx95_supported": lambda: False,
    "is_gfx942_supported": lambda: False,
    "is_npu_arch35": lambda: False,
    "is_gfx1250_supported": lambda: False,
    "_get_device_sm_via_nvml": lambda: None,
}


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


class StandInModule(types.ModuleType):
    """A third-party module: every attribute is an `Unknown`."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return Unknown(f"{self.__name__}.{attribute}")


def stand_in_torch(capability: Capability) -> types.ModuleType:
    torch = StandInModule("torch")
    torch.__path__ = []
    torch.__version__ = "2.9.1+cu129"  # type: ignore[attr-defined]
    cuda = StandInModule("torch.cuda")
    cuda.is_available = lambda: True  # type: ignore[attr-defined]
    cuda.is_initialized = lambda: True  # type: ignore[attr-defined]
    cuda.device_count = lambda: 1  # type: ignore[attr-defined]
    cuda.get_device_capability = lambda device=None: capability  # type: ignore[attr-defined]
    cuda.get_device_name = lambda device=None: device_name(capability)  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    for other in ("cpu", "xpu", "npu", "mps", "musa", "hpu"):
        absent = StandInModule(f"torch.{other}")
        absent.is_available = lambda: False  # type: ignore[attr-defined]
        setattr(torch, other, absent)
    torch.backends = StandInModule("torch.backends")  # type: ignore[attr-defined]
    torch.backends.mps = torch.mps
    torch.version = types.SimpleNamespace(cuda="12.9", hip=None, xpu=None)  # type: ignore[attr-defined]
    return torch


class CudaPlatform:
    """`sglang.srt.platforms.current_platform` (0.5.16+) of an NVIDIA box: SGLang's own."""

    def is_out_of_tree(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Unknown:
        return Unknown(f"current_platform.{name}")
