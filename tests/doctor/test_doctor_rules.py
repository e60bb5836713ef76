"""doctor's scanner and rules on small trees written here: the EAGLE-3 check, the gate and
table rules, SGLang's helpers and probes read from the target, what a patch covers."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api, catalogue, cli
from sglpatch.cli import app
from sglpatch.doctor import coverage
from sglpatch.doctor.gates import devices, scanner
from sglpatch.doctor.read.source_tree import Source
from sglpatch.errors import CatalogueError, ExitCode
from tests.support.releases import SEED

# --- small trees written here ---------------------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def tiny_tree(root: Path, with_method: bool) -> Path:
    package = root / "site" / "sglang"
    write(package / "__init__.py", "")
    write(package / "_version.py", f'__version__ = "{SEED}"\n')  # unknown is not ready
    write(
        package / "srt" / "speculative" / "eagle_worker.py",
        """
        class EAGLEWorker:
            def init(self):
                embed, head = self.target_worker.model_runner.model.get_embed_and_head()
        """,
    )
    method = "def get_embed_and_head(self):\n        return 1, 2" if with_method else "pass"
    write(
        package / "srt" / "models" / "tiny.py",
        f"""
class Base:
    {method}

class Tiny(Base):
    def __init__(self):
        self.logits_processor = object()

class TinyEmbedding(Base):
    def __init__(self):
        self.pooler = object()

EntryClass = [Tiny, TinyEmbedding]
""",
    )
    return root / "site"


def test_a_ready_tree_exits_zero_and_says_ready(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "Tiny"])
    assert result.exit_code == 0, result.stdout
    assert result.stdout.splitlines()[0].endswith(": ready")
    assert result.stderr == ""  # no progress when stderr is not a terminal


def test_a_missing_method_blocks_and_exits_5(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=False)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "tiny", "--eagle3"])
    assert result.exit_code == ExitCode.GAPS
    assert "1 blocker, none fixed by `sglpatch apply`" in result.stdout.splitlines()[0]
    assert "Tiny lacks get_embed_and_head" in result.stdout
    census = api.diagnose(site).diagnosis
    assert [m.name for m in census.models] == ["Tiny"]  # the pooling class is no target
    assert census.ready  # without --model only known capability-12 breakage blocks


def test_progress_goes_to_a_terminal_stderr_only(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    monkeypatch.setattr(cli.doctor, "_stderr_is_terminal", lambda: True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--json"])
    assert "doctor: scanning capability gates" in result.stderr
    assert json.loads(result.stdout)["ready"] is True


def test_an_unknown_model_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "nope"])
    assert result.exit_code == ExitCode.USAGE and "nope" in result.stderr


def test_model_path_without_config_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "-t", str(site), "--model-path", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE and "config.json" in result.stderr


HELPERS = devices.KNOWN_HELPERS
IMPORTS = "from sglang.srt.utils import get_device_sm, is_blackwell, is_sm100_supported, is_sm120_supported\nimport torch\n"


@pytest.mark.parametrize(
    ("code", "kind", "gets"),
    [
        # taken apart from 10
        (
            "if torch.cuda.get_device_capability()[0] == 10:\n    a = 1\nelse:\n    a = 2\n",
            "excludes",
            "a = 2",
        ),
        (
            "if is_sm100_supported():\n    b = 'trtllm'\nelse:\n    b = 'triton'\n",
            "excludes",
            "'triton'",
        ),
        ("ok = major in (9, 10)\n", "excludes", "False"),
        ("x = 'fa' if get_device_sm() == 100 else 'tr'\n", "excludes", "'tr'"),
        (
            "_on = is_sm100_supported()\ndef f():\n    if _on:\n        return 1\n    return 2\n",
            "excludes",
            "skips",
        ),
        # grouped with 9/10 by a range or a family helper
        (
            "def f():\n    sm = get_device_sm()\n    if sm < 90:\n        return False\n    return True\n",
            "shares",
            "skips",
        ),
        ("if is_blackwell():\n    use = 'deep_gemm'\n", "shares", "deep_gemm"),
        ("ok = torch.cuda.get_device_capability() >= (9, 0)\n", "shares", "True"),
        # refusals: a clear error on 12
        ("assert major in (9, 10, 11), 'unsupported'\n", "refusal", "AssertionError"),
        (
            "if not is_sm100_supported():\n    raise ValueError('needs SM100')\n",
            "refusal",
            "raises",
        ),
        # not reported
        ("if major == 9:\n    a = 'fa3'\nelse:\n    a = 'triton'\n", None, ""),  # 10 and 12 alike
        ("if major == 8:\n    a = 1\nelse:\n    a = 2\n", None, ""),  # an Ampere special case
        ("if major == 10 or major == 12:\n    a = 1\n", None, ""),  # names 12 in the chain
        ("if torch.version.hip:\n    pass\nelif False:\n    pass\n", None, ""),
        ("if _is_hip:\n    if major == 10:\n        a = 1\n", None, ""),  # never on NVIDIA
        ("ok = get_device_sm() >= 80\n", None, ""),  # Ampere too: no SM90/SM100 path
        ("v = torch_version.major >= 2\n", None, ""),  # a library's version
        ("ok = CUDA_CAPABILITY[1] == 9\n", None, ""),  # a minor version
        (  # a code sample in a docstring is prose
            'def pick():\n    """For example:\n\n    if is_sm100_supported():\n'
            '        return "trtllm"\n    """\n    return "triton"\n',
            None,
            "",
        ),
        (
            "def f():\n    assert major in (9, 10), 'x'\n    if major == 10:\n        return 1\n",
            "refusal",
            "AssertionError",
        ),  # the rest is unreachable
    ],
)
def test_gate_rules(code: str, kind: str | None, gets: str) -> None:
    found = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/mod.py", HELPERS)
    found = [f for f in found if f.kind != "decides"]  # judged harmless unless they choose
    assert [f.kind for f in found] == ([kind] if kind else []), found
    if kind:
        assert gets in found[0].gets and found[0].line > IMPORTS.count("\n")


@pytest.mark.parametrize(
    ("code", "gets"),
    [
        ("SIZES = {9: 1, 10: 2}\nx = SIZES[capability]\n", "KeyError: 12"),
        ("SIZES = {9: 1, 10: 2, 12: 3}\nx = SIZES[capability]\n", None),
        ("SIZES = {9: 1, 10: 2}\nx = SIZES.get(capability, 0)\n", None),  # tolerant lookup
        ("WORLD = {2: 1, 4: 2, 8: 3}\nx = WORLD[n]\n", None),  # world sizes, not majors
    ],
)
def test_table_rules(code: str, gets: str | None) -> None:
    found = scanner.scan_bytes(code.encode(), "sglang/mod.py", HELPERS)
    assert [f.gets for f in found] == ([gets] if gets else [])


def test_helpers_are_read_from_the_targets_own_definition(tmp_path: Path) -> None:
    """A release that redefines a helper (here: is_blackwell without 12) is taken at its word."""
    write(
        tmp_path / "sglang" / "srt" / "utils" / "common.py",
        """
        is_blackwell = lru_cache(maxsize=1)(
            partial(_check_cuda_device_version, device_capability_majors=[10, 11], cuda_version=(12, 8))
        )
        """,
    )
    helpers = devices.helpers_of(Source(tmp_path / "sglang"))
    assert helpers["is_blackwell"] == {10, 11}
    found = scanner.scan_bytes(b"if is_blackwell():\n    a = 1\n", "sglang/m.py", helpers)
    assert [f.kind for f in found] == ["excludes"]


def test_platform_probes_are_read_from_the_targets_own_table(tmp_path: Path) -> None:
    """`get_platform().is_sm100` is the helper `_PLATFORM_PROBES` names, with its majors."""
    write(
        tmp_path / "sglang" / "srt" / "runtime_context.py",
        """
        _PLATFORM_PROBES: Dict[str, str] = {
            "is_hip": "is_hip",
            "is_sm100": "is_sm100_supported",
            "is_sm120": "is_sm120_supported",
            "is_blackwell": "is_blackwell_supported",
        }
        """,
    )
    helpers = devices.helpers_of(Source(tmp_path / "sglang"))
    assert helpers["get_platform().is_sm100"] == {10}
    assert helpers["get_platform().is_blackwell"] == {10, 11, 12}
    cases = {
        "if get_platform().is_sm100:\n    a = 1\nelse:\n    a = 2\n": ["excludes"],
        "use = 'deep_gemm' if get_platform().is_blackwell else 'triton'\n": ["shares"],
        "if get_platform().device_sm >= 90:\n    a = 1\n": ["shares"],
        # names 12 in the chain: evaluated like any other (12 takes `a = 3`, 10 does not)
        "if get_platform().is_sm120:\n    a = 3\nelif get_platform().is_sm100:\n    a = 1\n": [
            "excludes"
        ],
        # never on NVIDIA
        "if get_platform().is_hip:\n    if get_platform().is_sm100:\n        a = 1\n": [],
        # a probe the table does not know decides nothing
        "if get_platform().is_sm100_or_newer:\n    a = 1\n": [],
        # through a name the scope assigns from get_platform()
        "def f():\n    p = get_platform()\n    if p.is_sm100:\n        return 1\n    return 2\n": [
            "excludes"
        ],
        # a function that asks the is_sm120 probe: each decision is still judged on its own
        "def f():\n    if get_platform().is_sm120:\n        return 3\n"
        "    if get_platform().is_sm100:\n        return 1\n    return 2\n": [
            "excludes",
            "excludes",
        ],
    }
    for code, kinds in cases.items():
        found = scanner.scan_bytes(code.encode(), "sglang/m.py", helpers)
        assert [f.kind for f in found] == kinds, code


def test_a_patch_covers_the_finding_its_change_removes(tmp_path: Path) -> None:
    package = tmp_path / "sglang"
    write(
        package / "srt/distributed/device_communicators/all_reduce_utils.py",
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {2: 1}, 10: {2: 2}}\n",
    )
    version = Version(SEED)
    checks = coverage.check(package, version, catalogue.load())
    findings = scanner.scan(Source(package), HELPERS)
    covered = coverage.covered_by(
        findings, checks, lambda data, shown: scanner.scan_bytes(data, shown, HELPERS)
    )
    assert [(f.kind, covered.get(f)) for f in findings] == [("table", "sm120-symm-mem-sizes")]


def test_coverage_refuses_a_patch_path_that_leaves_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalogue run in memory goes through `Patch.package_file`, like apply."""
    package = tmp_path / "sglang"
    package.mkdir()
    (tmp_path / "outside.py").write_text("TABLE = {9: 1, 10: 2}\n")
    patch = catalogue.load()[0]
    monkeypatch.setattr(patch, "target_file", lambda release: "../outside.py")
    monkeypatch.setattr(patch, "fixed_upstream", lambda release: False)
    with pytest.raises(CatalogueError, match=r"\.\./outside\.py"):
        coverage.check(package, Version(SEED), [patch])
