"""The GPUs doctor reasons about, by compute capability (as `torch.cuda.get_device_capability()`
gives it): the capability-12 parts it answers for, and the older ones each gate is compared
with (what 10.0 gets there is what SGLang meant for Blackwell).

Source: NVIDIA's CUDA GPU list (https://developer.nvidia.com/cuda-gpus): 8.0 is A100, 9.0
H100 and H200, 10.0 B200 and GB200; 12.0 the GeForce RTX 50 series and the RTX PRO Blackwell
cards, 12.1 the GB10 of DGX Spark.
"""

from __future__ import annotations

from typing import NamedTuple

Capability = tuple[int, int]  # (major, minor)


class Gpu(NamedTuple):
    """One part, by its compute capability."""

    capability: Capability
    products: str  # what a user owns with it

    @property
    def shown(self) -> str:
        """ "12.0": as doctor's reports and `--capability` spell it."""
        return "{}.{}".format(*self.capability)


AMPERE = Gpu((8, 0), "A100")
HOPPER = Gpu((9, 0), "H100, H200")
B200 = Gpu((10, 0), "B200, GB200")
RTX_BLACKWELL = Gpu((12, 0), "RTX PRO 6000, RTX 5090")
GB10 = Gpu((12, 1), "GB10, DGX Spark")
# Every part a gate is evaluated for, oldest first.
GPUS = (AMPERE, HOPPER, B200, RTX_BLACKWELL, GB10)
# The major doctor answers for, and its parts.
NEW = 12
ASKED = tuple(gpu for gpu in GPUS if gpu.capability[0] == NEW)
# Both parts as spelled: what doctor judges unless --capability names one.
CAPABILITIES = tuple(gpu.shown for gpu in ASKED)
