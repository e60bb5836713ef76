"""The README's launch recipe uses only flags, and values, that the seed release accepts."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from sglpatch.doctor.facts import kernel_support as support
from tests.support import syntax, wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTION = README.split("### Then: launch SGLang")[1].split("\n### ")[0]


def recipe() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", SECTION, re.S)
    assert block, "the launch section has no sh block"
    return shlex.split(block.group(1).replace("\\\n", " "))


def declared(release: str) -> dict[str, list[str] | None]:
    """Each `--flag` that `release`'s `ServerArgs.add_cli_args` declares, with its literal choices
    (None: any value), read from the release's own `server_args.py`."""
    tree = syntax.tree(wheels.member(release, "sglang/srt/server_args.py"))
    lists = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    flags: dict[str, list[str] | None] = {}
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant)]
        choices = next((k.value for k in call.keywords if k.arg == "choices"), None)
        if isinstance(choices, ast.Name):
            choices = lists.get(choices.id)
        allowed = None
        if isinstance(choices, (ast.List, ast.Tuple)):
            allowed = [e.value for e in choices.elts if isinstance(e, ast.Constant)]
        for name in names:
            if isinstance(name, str) and name.startswith("--"):
                flags[name] = allowed
    return flags


def options(argv: list[str]) -> dict[str, str | None]:
    """`--flag value` pairs of a command line (a flag followed by a flag takes no value)."""
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv[:3]
    found: dict[str, str | None] = {}
    rest = argv[3:]
    for i, word in enumerate(rest):
        if word.startswith("--"):
            following = rest[i + 1] if i + 1 < len(rest) else None
            found[word] = None if following is None or following.startswith("--") else following
        else:
            assert i > 0 and rest[i - 1].startswith("--"), f"stray word {word!r}"
    return found


def test_every_flag_and_value_is_the_seed_releases_own() -> None:
    flags = declared(SEED)
    assert "--model-path" in flags and flags["--speculative-algorithm"]  # the reader works
    used = options(recipe())
    assert {"--speculative-algorithm", "--speculative-draft-model-path"} <= used.keys()
    for flag, value in used.items():
        assert flag in flags, f"{flag} is not a flag of SGLang {SEED}"
        allowed = flags[flag]
        if allowed is not None:
            assert value in allowed, f"{flag} {value}: {SEED} allows {allowed}"


def test_a_flag_the_release_lacks_is_caught() -> None:
    flags = declared(SEED)
    assert "--no-such-flag" not in flags
    assert flags["--speculative-algorithm"] is not None
    assert "EAGLE9" not in flags["--speculative-algorithm"]


def test_the_draft_tokens_fit_the_steps() -> None:
    used = options(recipe())
    steps, topk = int(used["--speculative-num-steps"] or 0), used["--speculative-eagle-topk"]
    assert used["--speculative-algorithm"] == "EAGLE3"
    if topk == "1":  # SGLang's rule for a chain draft: one token per step, plus the root
        assert int(used["--speculative-num-draft-tokens"] or 0) == steps + 1


def test_the_attention_backend_runs_on_12_and_symm_mem_is_not_passed() -> None:
    used = options(recipe())
    backend = used["--attention-backend"]
    assert backend is not None
    for capability in ((12, 0), (12, 1)):
        assert support.runs_on("attention", backend, capability) is True
    assert "--enable-torch-symm-mem" not in used
