"""The kernels section on site-packages trees built here: the shapes of torch, sgl-kernel,
FlashInfer and Triton, with ELF libraries from test_kernels_elf and stand-in compilers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglpatch.doctor.kernels import inspect, packages, render
from sglpatch.doctor.kernels.packages import sgl_kernel_build
from tests.support import fifos
from tests.test_kernels_elf import PTX, SASS, build_elf, container, entry

A = 0x11 | 0x100000  # an arch-specific entry's flags
LOADER = """
def _load_architecture_specific_ops():
    compute_capability = _get_compute_capability()
    if compute_capability == 90:
        ops_subdir = "sm90"
        variant_name = "SM90"
    elif compute_capability is not None:
        ops_subdir = "sm100"
        variant_name = f"SM{compute_capability}"
    else:
        ops_subdir = "sm100"
"""


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def dist(sp: Path, name: str, version: str, files: tuple[str, ...] = ()) -> None:
    folder = sp / f"{name}-{version}.dist-info"
    write(folder / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    write(folder / "RECORD", "".join(f"{f},,\n" for f in files))


def lib(*entries: bytes) -> bytes:
    return build_elf([(".text", b"\x90" * 8), (".nv_fatbin", container(*entries))])


def stand_in(path: Path, release: str, targets: str, *, sleep: float = 0) -> Path:
    """A compiler that answers --version and --help as ptxas/nvcc do."""
    script = f"""\
        #!/bin/sh
        case "$1" in
          --version) {f"sleep {sleep}; " if sleep else ""}echo "Cuda compilation tools, release {release}, V{release}.1";;
          --help) printf -- "--gpu-name\\n        Allowed values for this option:  {targets}.\\n\\n";;
        esac
        """
    write(path, textwrap.dedent(script))
    path.chmod(0o755)
    return path


OLD_TARGETS = "'sm_100','sm_100a','sm_120','sm_120a','sm_90','sm_90a'"
NEW_TARGETS = OLD_TARGETS + ",'sm_120f','sm_121','sm_121a','sm_121f'"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """SGLang 0.5.9's kernel wheels in miniature: what each really carries (measured)."""
    sp = tmp_path / "site-packages"
    dist(sp, "torch", "2.9.1")
    write(sp / "torch/__init__.py", "raise SystemExit('torch imported')\n")
    write(sp / "torch/version.py", "__version__ = '2.9.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    write(
        sp / "torch/lib/libtorch_cuda.so",
        lib(entry(SASS, 90), entry(SASS, 120), entry(SASS, 120, A)),
    )
    dist(sp, "sgl_kernel", "0.3.21", ("deep_gemm/__init__.py", "triton_kernels/__init__.py"))
    write(sp / "sgl_kernel/__init__.py", "raise SystemExit('sgl_kernel imported')\n")
    write(sp / "sgl_kernel/load_utils.py", LOADER)
    sm100 = lib(entry(SASS, 90, A), entry(SASS, 100, A), entry(SASS, 120, A))
    write(sp / "sgl_kernel/sm100/common_ops.abi3.so", sm100)
    write(sp / "sgl_kernel/sm90/common_ops.abi3.so", lib(entry(SASS, 90, A)))
    write(sp / "deep_gemm/__init__.py", "raise SystemExit\n")
    write(sp / "triton_kernels/__init__.py", "raise SystemExit\n")
    dist(sp, "flashinfer_python", "0.6.3")
    write(sp / "flashinfer/__init__.py", "raise SystemExit\n")
    dist(sp, "flashinfer_cubin", "0.6.3")
    cubin = build_elf([(".text", b"")], machine=190, flags=0x0600640A, osabi=0x41, abi_version=8)
    write(sp / "flashinfer_cubin/cubins/h/fmha/fmhaSm100aKernel.cubin", cubin)
    dist(sp, "nvidia_cutlass_dsl", "4.3.4")
    dist(sp, "triton", "3.5.1")
    write(sp / "triton/__init__.py", "__version__ = '3.5.1'\nraise SystemExit\n")
    write(sp / "triton/backends/nvidia/compiler.py", "def get_ptxas(): return knobs.nvidia.ptxas\n")
    stand_in(sp / "triton/backends/nvidia/bin/ptxas", "12.8", OLD_TARGETS)
    return sp


def env_with(tmp_path: Path, **extra: str) -> dict[str, str]:
    nvcc = stand_in(tmp_path / "cuda-13.0/bin/nvcc", "13.0", NEW_TARGETS)
    return {"PATH": os.environ["PATH"], "CUDA_HOME": str(nvcc.parent.parent), **extra}


def by_package(sp: Path, environ: dict[str, str]) -> dict[str, dict[str, object]]:
    return {f.package: f.to_json() for f in inspect(sp, environ=environ)}


def test_059_shape(site: Path, tmp_path: Path) -> None:
    found = by_package(site, env_with(tmp_path))
    assert found["torch"]["runs_on"] == {"12.0": True, "12.1": True}
    assert found["torch"]["cuda"] == "12.8"
    sgl = found["sgl-kernel"]
    assert sgl["runs_on"] == {"12.0": True, "12.1": False}
    assert sgl["loads"] == {"12.0": "sgl_kernel/sm100/common_ops.abi3.so"} | {
        "12.1": "sgl_kernel/sm100/common_ops.abi3.so"
    }
    assert "sm_120a is arch-specific (12.0 only)" in str(sgl["why"])
    assert "sm_121a" in str(sgl["fix"])
    assert found["flashinfer-python"]["runs_on"] == {"12.0": True, "12.1": True}
    cubin = found["flashinfer-cubin"]
    assert cubin["runs_on"] == {"12.0": False, "12.1": False}
    assert cubin["required"] is False and cubin["archs"] == {"sm_100a": 1}
    assert found["deep_gemm"]["version"] == "bundled with sgl-kernel 0.3.21"
    assert found["deep_gemm"]["runs_on"] == {"12.0": None, "12.1": None}
    assert found["triton_kernels"]["version"] == "bundled with sgl-kernel 0.3.21"
    assert found["nvidia-cutlass-dsl"]["version"] == "4.3.4"
    triton = found["triton"]
    assert triton["runs_on"] == {"12.0": True, "12.1": False}
    assert triton["ptxas_version"] == "12.8"
    assert "does not know sm_121a" in str(triton["why"])
    assert "TRITON_PTXAS_PATH" in str(triton["fix"])
    json.dumps(list(found.values()))  # the JSON shape is plain data


def test_blockers_and_text(site: Path, tmp_path: Path) -> None:
    findings = inspect(site, environ=env_with(tmp_path))
    blockers = {f.package for f in findings if f.blocks("12.1")}
    assert blockers == {"sgl-kernel", "triton"}
    assert not any(f.blocks("12.0") for f in findings)
    text = "\n".join(render(findings, ("12.0", "12.1")))
    assert "sgl-kernel 0.3.21: 12.0 runs, 12.1 does not run  [blocker on 12.1]" in text
    assert "triton 3.5.1: 12.0 runs, 12.1 does not run  [blocker on 12.1]" in text
    assert "fix: set TRITON_PTXAS_PATH" in text


def test_triton_ptxas_override(site: Path, tmp_path: Path) -> None:
    new = stand_in(tmp_path / "cuda-12.9/bin/ptxas", "12.9", NEW_TARGETS)
    triton = by_package(site, env_with(tmp_path, TRITON_PTXAS_PATH=str(new)))["triton"]
    assert triton["runs_on"] == {"12.0": True, "12.1": True}
    assert (triton["ptxas_from"], triton["fix"]) == ("$TRITON_PTXAS_PATH", None)
    # An override that does not run is ignored, as Triton falls back to its own.
    broken = by_package(site, env_with(tmp_path, TRITON_PTXAS_PATH=str(tmp_path / "nope")))
    assert broken["triton"]["ptxas_from"] == "bundled"


def test_triton_ptxas_blackwell_and_version_only(site: Path, tmp_path: Path) -> None:
    nvidia = site / "triton/backends/nvidia"
    write(nvidia / "compiler.py", "def get_ptxas(arch): return knobs.nvidia.ptxas_blackwell\n")
    write(
        nvidia / "bin/ptxas-blackwell",
        "#!/bin/sh\necho 'Cuda compilation tools, release 13.4, V13.4.59'\n",
    )
    (nvidia / "bin/ptxas-blackwell").chmod(0o755)
    triton = by_package(site, env_with(tmp_path))["triton"]
    # No --help list: the release decides (sm_121a is known from CUDA 12.9).
    assert triton["runs_on"] == {"12.0": True, "12.1": True}
    assert str(triton["ptxas"]).endswith("ptxas-blackwell")


def test_a_hanging_ptxas_is_not_judged(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglpatch.doctor.kernels import tools

    monkeypatch.setattr(tools, "_TIMEOUT_S", 0.5)
    stand_in(site / "triton/backends/nvidia/bin/ptxas", "12.8", OLD_TARGETS, sleep=5)
    triton = by_package(site, env_with(tmp_path))["triton"]
    assert triton["runs_on"] == {"12.0": None, "12.1": None}
    assert "ran longer than" in str(triton["why"])


def test_flashinfer_nvcc_choices(site: Path, tmp_path: Path) -> None:
    old = stand_in(tmp_path / "cuda-12.8/bin/nvcc", "12.8", OLD_TARGETS)
    found = by_package(site, {"PATH": "/nonexistent", "FLASHINFER_NVCC": str(old)})
    fi = found["flashinfer-python"]
    assert fi["runs_on"] == {"12.0": True, "12.1": False}
    assert fi["nvcc_from"] == "FLASHINFER_NVCC" and "12.9" in str(fi["fix"])


def test_cpu_only_torch(site: Path, tmp_path: Path) -> None:
    write(site / "torch/version.py", "__version__ = '2.9.1+cpu'\ncuda = None\n")
    torch = by_package(site, env_with(tmp_path))["torch"]
    assert torch["runs_on"] == {"12.0": False, "12.1": False}
    assert "CPU-only" in str(torch["why"]) and torch["fix"]
    write(site / "torch/version.py", "__version__ = '2.9.1+rocm6.4'\ncuda = None\nhip = '6.4'\n")
    torch = by_package(site, env_with(tmp_path))["torch"]
    assert "a ROCm build (hip 6.4)" in str(torch["why"])


def test_render_absent_packages(tmp_path: Path) -> None:
    lines = render(inspect(tmp_path, ("12.1",), environ={"PATH": ""}), ("12.1",))
    assert "  - torch (not installed): 12.1 not judged" in lines
    assert not any("blocker" in line for line in lines)


@pytest.mark.parametrize(
    "damage",
    ["directory", "truncated", "wrong fat size", "fifo", "missing"],
)
def test_bad_binaries_are_not_judged(site: Path, tmp_path: Path, damage: str) -> None:
    target = site / "sgl_kernel/sm100/common_ops.abi3.so"
    whole = target.read_bytes()
    target.unlink()
    if damage == "directory":
        target.mkdir()
        (target / "x").write_text("")
    elif damage == "truncated":
        target.write_bytes(whole[:100])
    elif damage == "wrong fat size":
        at = whole.index((0xBA55ED50).to_bytes(4, "little"))
        target.write_bytes(whole[: at + 8] + (10**9).to_bytes(8, "little") + whole[at + 16 :])
    elif damage == "fifo":
        os.mkfifo(target)
    torch_lib = site / "torch/lib/libtorch_cuda.so"
    torch_lib.write_bytes(torch_lib.read_bytes()[:50])
    found = by_package(site, env_with(tmp_path))
    sgl, torch = found["sgl-kernel"], found["torch"]
    assert sgl["runs_on"] == {"12.0": None, "12.1": None}, sgl
    assert "not judged" in str(sgl["why"])
    assert torch["runs_on"] == {"12.0": None, "12.1": None}
    assert "truncated ELF" in str(torch["why"])


@pytest.mark.parametrize(
    ("fat", "reason"),
    [
        (b"\0" * 4096, "the section holds no container"),
        (container() * 3, "3 containers and no SASS or PTX entry"),
    ],
    ids=["zeros", "empty containers"],
)
def test_a_fat_binary_without_code_is_not_judged_not_a_blocker(
    site: Path, tmp_path: Path, fat: bytes, reason: str
) -> None:
    """A `.nv_fatbin` of zeros or of empty containers is damage: "not judged" with the
    reason, never "does not run" (before: both packages blocked 12.0 and 12.1)."""
    damaged = build_elf([(".text", b"\x90" * 8), (".nv_fatbin", fat)])
    write(site / "torch/lib/libtorch_cuda.so", damaged)
    write(site / "sgl_kernel/sm100/common_ops.abi3.so", damaged)
    findings = inspect(site, environ=env_with(tmp_path))
    found = {f.package: f for f in findings}
    for package in ("torch", "sgl-kernel"):
        assert found[package].runs_on == {"12.0": None, "12.1": None}, found[package]
        assert reason in found[package].why
    assert {f.package for f in findings if f.blocks("12.0") or f.blocks("12.1")} == {"triton"}
    text = render(findings, ("12.0", "12.1"))
    assert "  - torch 2.9.1: 12.0 not judged, 12.1 not judged" in text
    assert f"      libtorch_cuda.so: damaged fat binary: {reason}" in "\n".join(text)


def test_a_kernel_folder_that_cannot_be_listed_is_not_judged(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Path.rglob` skipped a folder it could not list in silence: the jit cache was judged by
    the libraries it could list, and flashinfer-cubin counted no unreadable cubin. The denial is
    monkeypatched at the OS boundary (`os.scandir`, which rglob calls too): root, which runs the
    tests here, lists any folder whatever its mode."""
    write(site / "flashinfer_jit_cache/jit/a/ok.so", lib(entry(SASS, 120, A)))
    write(site / "flashinfer_jit_cache/jit/b/hidden.so", lib(entry(SASS, 90)))
    cubin = build_elf([(".text", b"")], machine=190, flags=0x0600640A, osabi=0x41, abi_version=8)
    write(site / "flashinfer_cubin/cubins/x/hidden.cubin", cubin)
    denied = {str(site / "flashinfer_jit_cache/jit/b"), str(site / "flashinfer_cubin/cubins/x")}
    real = os.scandir

    def scandir(path: str | os.PathLike[str] = ".") -> object:
        if os.fspath(path) in denied:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = by_package(site, env_with(tmp_path))
    cache = found["flashinfer-jit-cache"]
    assert cache["runs_on"] == {"12.0": None, "12.1": None}, cache
    assert cache["why"] == "flashinfer_jit_cache/jit/b/: cannot be listed: Permission denied"
    assert found["flashinfer-cubin"]["unreadable"] == 1
    assert found["flashinfer-cubin"]["archs"] == {"sm_100a": 1}


def test_empty_environment_costs_nothing(tmp_path: Path) -> None:
    start = time.perf_counter()
    findings = inspect(tmp_path, environ={"PATH": ""})
    assert time.perf_counter() - start < 0.5
    assert all(v is None for f in findings for v in f.runs_on.values())
    assert {f.package for f in findings} >= {"torch", "sgl-kernel", "triton", "flashinfer-python"}


def test_a_missing_site_packages_never_raises(tmp_path: Path) -> None:
    assert inspect(tmp_path / "absent", ("12.0", "nonsense"), environ={})


@pytest.mark.parametrize(
    ("source", "capability", "subdir"),
    [
        (LOADER, (12, 0), "sm100"),
        (LOADER, (9, 0), "sm90"),
        (LOADER.replace("== 90", ">= 120").replace('"sm90"', '"sm120"'), (12, 1), "sm120"),
        (LOADER.replace("compute_capability == 90", "is_hopper()"), (12, 0), None),
        ("ops = 1\n", (12, 0), None),
        ("def broken(:\n", (12, 0), None),
    ],
)
def test_sgl_kernel_loader(
    tmp_path: Path, source: str, capability: tuple[int, int], subdir: str | None
) -> None:
    write(tmp_path / "sgl_kernel/load_utils.py", source)
    assert sgl_kernel_build(tmp_path / "sgl_kernel", capability).subdir == subdir


def test_older_sgl_kernel_without_loader(site: Path, tmp_path: Path) -> None:
    pkg = site / "sgl_kernel"
    (pkg / "load_utils.py").unlink()
    (pkg / "sm100/common_ops.abi3.so").rename(pkg / "common_ops.abi3.so")
    sgl = by_package(site, env_with(tmp_path))["sgl-kernel"]
    assert sgl["loads"] == {
        "12.0": "sgl_kernel/common_ops.abi3.so",
        "12.1": "sgl_kernel/common_ops.abi3.so",
    }


def test_ptx_is_judged_as_jit(site: Path, tmp_path: Path) -> None:
    write(site / "torch/lib/libtorch_cuda.so", lib(entry(SASS, 90), entry(PTX, 90)))
    torch = by_package(site, env_with(tmp_path))["torch"]
    assert torch["runs_on"] == {"12.0": True, "12.1": True}
    assert "JIT-compiles its compute_90 PTX" in str(torch["why"])


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_reading_imports_nothing_and_changes_nothing(site: Path, tmp_path: Path) -> None:
    before = snapshot(site)
    code = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(site)!r})  # the tree's packages would win any import
        from sglpatch.doctor.kernels import inspect
        found = inspect(Path({str(site)!r}), environ={{"PATH": ""}})
        kernels = {{"torch", "triton", "sgl_kernel", "flashinfer", "flashinfer_cubin",
                   "deep_gemm", "triton_kernels", "cutlass"}}
        print(json.dumps([m for m in sys.modules if m.split(".")[0] in kernels]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    assert snapshot(site) == before


def test_a_fifo_swapped_in_after_the_check_is_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_text checked with `is_file()`, then opened: a FIFO swapped in between (here: the
    check answers as it did for the file before) was opened, and doctor waited for a writer."""
    fifo = tmp_path / "METADATA"
    os.mkfifo(fifo)
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    small = os.stat(os.devnull)  # noqa: PTH116 - Path.stat is the one replaced
    monkeypatch.setattr(Path, "stat", lambda self, **kw: small)
    assert fifos.without_waiting(fifo, lambda: packages.read_text(fifo)) is None
