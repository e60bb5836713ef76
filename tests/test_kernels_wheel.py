"""The fat-binary reader on a real kernel wheel: sgl-kernel 0.3.21, which SGLang 0.5.9 pins.

Opt in with SGLPATCH_KERNEL_WHEEL_TESTS=1: the wheel is 536 MB (about 10 s to download on a
fast link, minutes on a slow one; then cached in SGLPATCH_WHEEL_CACHE, default
.cache/wheels) and the test unpacks two 360-370 MB libraries into a temporary folder.
The expected figures are `cuobjdump --list-elf` (CUDA 13.5) on the same files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from sglpatch.doctor.kernels import fatbin
from sglpatch.doctor.kernels.packages import sgl_kernel_build
from tests.support.wheels import CACHE

pytestmark = [
    pytest.mark.wheel,
    pytest.mark.skipif(
        os.environ.get("SGLPATCH_KERNEL_WHEEL_TESTS") != "1",
        reason="set SGLPATCH_KERNEL_WHEEL_TESTS=1 to download sgl-kernel 0.3.21 (536 MB)",
    ),
]

WHEEL = "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl"
# cuobjdump --list-elf: 74 cubins per architecture in each build; no PTX.
COMMON_OPS = {"sm_80": 74, "sm_89": 74, "sm_90": 74, "sm_90a": 74, "sm_100a": 74, "sm_120a": 74}
FLASH_OPS = {"sm_80": 182, "sm_86": 182, "sm_90a": 182}


def sgl_kernel_wheel() -> Path:
    path = CACHE / WHEEL
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--platform", "manylinux2014_x86_64", "--python-version", "3.10",
             "-d", str(CACHE), "sgl-kernel==0.3.21"],
            check=True,
        )  # fmt: skip
    return path


def test_sgl_kernel_0_3_21(tmp_path: Path) -> None:
    with zipfile.ZipFile(sgl_kernel_wheel()) as wheel:
        for member in (
            "sgl_kernel/load_utils.py",
            "sgl_kernel/sm100/common_ops.abi3.so",
            "sgl_kernel/sm90/common_ops.abi3.so",
            "sgl_kernel/flash_ops.abi3.so",
        ):
            wheel.extract(member, tmp_path)
    pkg = tmp_path / "sgl_kernel"
    assert sgl_kernel_build(pkg, (12, 0)).subdir == "sm100"
    assert sgl_kernel_build(pkg, (12, 1)).subdir == "sm100"
    assert sgl_kernel_build(pkg, (9, 0)).subdir == "sm90"
    for lib, expected in (
        ("sm100/common_ops.abi3.so", COMMON_OPS),
        ("sm90/common_ops.abi3.so", COMMON_OPS),
        ("flash_ops.abi3.so", FLASH_OPS),
    ):
        codes, _compressed, section = fatbin.codes_in_library(pkg / lib)
        assert section == ".nv_fatbin"
        assert Counter({c.name: n for c, n in codes.items()}) == Counter(expected), lib
