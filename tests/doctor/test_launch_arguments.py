"""The launch-option reader on every release 0.5.3-0.5.23 (their own `server_args.py` and, from
0.5.20, `arg_groups/fields/*.py`, read from the wheels), and `parse_launch` with its tables."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import shlex
from pathlib import Path

import pytest

from sglpatch.doctor.launch.arguments import read_arguments
from sglpatch.doctor.launch.parse import Origin, parse_launch, serve_form
from sglpatch.doctor.launch.source import UNKNOWN, directory_source
from sglpatch.doctor.launch.table import ArgumentTable
from sglpatch.errors import TargetError, UsageError
from tests.support import wheels
from tests.support.releases import RELEASES, SEED

pytestmark = pytest.mark.wheel

SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS = "sglang/srt/arg_groups/fields/"
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
# Flags the four users pass, and whose defaults the dataclass field names.
KNOWN = ("--tp-size", "--attention-backend", "--kv-cache-dtype", "--mem-fraction-static",
         "--enable-torch-symm-mem", "--speculative-num-steps", "--page-size", "--port")  # fmt: skip


def source(release: str):  # type: ignore[no-untyped-def]
    names = set(wheels.members(release))
    return lambda name: wheels.member(release, name) if name in names else None


@functools.cache
def table(release: str) -> ArgumentTable:
    return read_arguments(source(release), release)


def recipe() -> list[str]:
    """The README's launch recipe (a `python -m sglang.launch_server` command)."""
    section = README.split("### Then: launch SGLang")[1].split("\n### ")[0]
    block = section.split("```sh\n")[1].split("```")[0]
    return shlex.split(block.replace("\\\n", " "))


@functools.cache
def field_defaults(release: str) -> dict[str, object]:
    """`ServerArgs`' field defaults that are literals, read here on their own: the class body
    in `server_args.py` and every class of `arg_groups/fields/` (0.5.20 and later)."""
    files = [SERVER_ARGS] + [n for n in wheels.members(release, FIELDS) if n.endswith(".py")]
    found: dict[str, object] = {}
    for name in files:
        # ast.parse, not the shared trees: each file is read once here, and fingerprinting a
        # 300 kB tree for sharing costs more than parsing it again
        for node in ast.parse(wheels.member(release, name)).body:
            if isinstance(node, ast.ClassDef) and (
                node.name == "ServerArgs" or name != SERVER_ARGS
            ):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        with contextlib.suppress(ValueError):  # a call or a name: no literal
                            found[item.target.id] = ast.literal_eval(item.value)  # type: ignore[arg-type]
    return found


@functools.cache
def own_defaults(release: str) -> dict[str, ast.expr]:
    """Each `add_argument("--flag", ..., default=<literal or argparse.SUPPRESS>)` of the
    release: a default the declaration gives itself instead of its field's."""
    own: dict[str, ast.expr] = {}
    for call in ast.walk(ast.parse(wheels.member(release, SERVER_ARGS))):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
            for keyword in call.keywords:
                if keyword.arg == "default" and (
                    isinstance(keyword.value, ast.Constant)
                    or ast.unparse(keyword.value) == "argparse.SUPPRESS"
                ):
                    for arg in call.args:
                        if isinstance(arg, ast.Constant):
                            own[str(arg.value)] = keyword.value
    return own


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_and_parses_the_readme_recipe(release: str) -> None:
    options = table(release)
    assert len(options.options) > 200  # every option, not a part of them
    assert {"--model-path", "--model"} <= set(options.option("--model-path").flags)  # type: ignore[union-attr]
    launch = parse_launch(options, recipe())
    assert launch.model_path == "moonshotai/Kimi-K2.5"
    assert launch.value("--tp-size") == 8 and launch.get("--tp-size").origin is Origin.GIVEN
    assert launch.value("tp_size") == 8  # the field's name, whatever argparse's dest
    assert launch.value("--speculative-algorithm") == "EAGLE3"
    assert launch.value("--speculative-num-draft-tokens") == 4
    assert launch.value("--trust-remote-code") is True
    symm = launch.get("--enable-torch-symm-mem")
    assert symm.value is False and symm.origin is Origin.DEFAULT
    assert launch.argv == tuple(recipe())


@pytest.mark.parametrize("release", RELEASES)
def test_defaults_are_the_dataclass_field_defaults(release: str) -> None:
    fields, own = field_defaults(release), own_defaults(release)
    for flag in KNOWN:
        option = table(release).option(flag)
        assert option is not None, f"{release} lacks {flag}"
        assert option.default == fields[flag[2:].replace("-", "_")], (release, flag)
    compared = 0
    for option in table(release):
        if option.dest not in fields:
            continue
        compared += 1
        if option.default != fields[option.dest]:
            # only where the declaration names a default of its own
            assert any(flag in own for flag in option.flags), (release, option)
    assert compared > 200


@pytest.mark.parametrize("release", RELEASES)
def test_unknown_flag_and_bad_choice_are_one_line_errors(release: str) -> None:
    options = table(release)
    with pytest.raises(UsageError) as unknown:
        parse_launch(options, ["--model-path", "m", "--no-such-flag", "1"])
    assert str(unknown.value) == f"SGLang {release} has no launch option --no-such-flag"
    with pytest.raises(UsageError) as choice:
        parse_launch(options, ["--model-path", "m", "--attention-backend", "warp9"])
    message = str(choice.value)
    assert "\n" not in message and "warp9" in message and "'triton'" in message
    with pytest.raises(UsageError, match="needs --model-path"):
        parse_launch(options, ["--tp-size", "2"])


@pytest.mark.parametrize("release", RELEASES)
def test_whole_command_forms_are_stripped(release: str) -> None:
    options = table(release)
    # prepare_server_args builds argparse.ArgumentParser(...) with abbreviations on, as here
    assert b"allow_abbrev" not in wheels.member(release, SERVER_ARGS)
    args = ["--model-path", "m", "--tp-size", "2", "--enable-torch-symm-mem"]
    bare = parse_launch(options, args).given
    assert bare == {"model_path": "m", options.option("--tp-size").dest: 2,  # type: ignore[union-attr]
                    "enable_torch_symm_mem": True}  # fmt: skip
    for command in (["python", "-m", "sglang.launch_server"], ["python3", "-m", "sglang.launch_server"],
                    ["/opt/venv/bin/python3.12", "-m", "sglang.launch_server"]):  # fmt: skip
        assert parse_launch(options, [*command, *args]).given == bare
    behind_env = parse_launch(
        options, ["env", "CUDA_VISIBLE_DEVICES=0,1", "python", "-m", "sglang.launch_server", *args]
    )
    assert behind_env.given == bare and behind_env.environ == {"CUDA_VISIBLE_DEVICES": "0,1"}
    form = serve_form(source(release)("sglang/cli/serve.py"))
    if form is None:  # 0.5.3-0.5.4.post3 ship no `sglang serve`
        with pytest.raises(UsageError, match="has no `sglang serve`"):
            parse_launch(options, ["sglang", "serve", *args], form)
        return
    assert parse_launch(options, ["sglang", "serve", *args], form).given == bare
    if form.strips_model_type:  # 0.5.10 on: `--model-type X` picks the backend, then goes
        assert (
            parse_launch(options, ["sglang", "serve", *args, "--model-type", "llm"], form).given
            == bare
        )
    if form.positional_model:  # 0.5.16 on: `sglang serve MODEL`
        assert parse_launch(options, ["sglang", "serve", "m", *args[2:]], form).given == bare


def test_abbreviations_are_allowed_as_sglang_allows_them() -> None:
    """`prepare_server_args` builds `argparse.ArgumentParser()`: allow_abbrev is on."""
    options = table(SEED)
    assert "argparse.ArgumentParser()" in wheels.member(SEED, SERVER_ARGS).decode()
    launch = parse_launch(options, ["--model-path", "m", "--mem-fraction", "0.8"])
    assert launch.value("--mem-fraction-static") == 0.8
    with pytest.raises(UsageError, match="ambiguous option: --enable-"):
        parse_launch(options, ["--model-path", "m", "--enable-"])


def test_dataclass_era_tables_hold_aliases_actions_and_imported_choices() -> None:
    newest = table(RELEASES[-1])
    tp = newest.option("--tensor-parallel-size")
    assert tp is not None and tp.dest == "tp_size" and tp.type == "int" and tp.default == 1
    attention = newest.option("--attention-backend")
    # choices named in arg_groups/fields/ and defined in arg_groups/choices.py: followed there
    assert (
        attention is not None
        and isinstance(attention.choices, tuple)
        and "triton" in attention.choices
    )
    lora = newest.option("--lora-paths")
    assert lora is not None and lora.action == "LoRAPathAction" and lora.nargs == "*"
    # registries filled at import time cannot be read: said so, not guessed
    reasoning = newest.option("--reasoning-parser")
    assert reasoning is not None and reasoning.choices is UNKNOWN
    launch = parse_launch(newest, ["--model", "m", "--reasoning-parser", "anything"])
    assert launch.value("--reasoning-parser") == "anything"
    symm = newest.option("--enable-torch-symm-mem")
    assert symm is not None and symm.action == "store_true"


def test_a_retired_flag_sglang_refuses_is_refused(tmp_path: Path) -> None:
    """A `DeprecatedAction` with an `error_message` stops SGLang's parser; here too."""
    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text(
        "import argparse\n"
        "class ServerArgs:\n"
        "    model_path: str = None\n"
        "    @staticmethod\n"
        "    def add_cli_args(parser):\n"
        "        parser.add_argument('--model-path', type=str, default=ServerArgs.model_path)\n"
        "        parser.add_argument('--old', action=DeprecatedAction, error_message='use --new')\n"
    )
    options = read_arguments(directory_source(tmp_path), "9.9")
    with pytest.raises(UsageError, match="use --new"):
        parse_launch(options, ["--model-path", "m", "--old"])
    assert parse_launch(options, ["--model-path", "m"]).get("--model-path").origin is Origin.GIVEN
    assert argparse.SUPPRESS not in {o.default for o in options}


def test_interpreter_and_env_options_are_stripped_other_commands_refused() -> None:
    options = table(SEED)
    args = ["--model-path", "m", "--tp-size", "2"]
    bare = parse_launch(options, args).given
    launch = parse_launch(
        options,
        [
            "env",
            "-u",
            "HF_HOME",
            "A=1",
            "python3",
            "-u",
            "-X",
            "dev",
            "-m",
            "sglang.launch_server",
            *args,
        ],
    )
    assert launch.given == bare and launch.environ == {"A": "1"}
    for other in (["python", "serve.py", *args], ["python", "-m", "vllm.entrypoints.openai.api_server", *args],
                  ["sglang", "generate", *args]):  # fmt: skip
        with pytest.raises(UsageError, match="is no launch of SGLang"):
            parse_launch(options, other)


def test_a_tree_without_server_args_is_a_target_error(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"no server_args\.py"):
        read_arguments(directory_source(tmp_path), "9.9")
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "srt" / "server_args.py").write_text("class ServerArgs:\n    pass\n")
    with pytest.raises(TargetError, match=r"no ServerArgs\.add_cli_args"):
        read_arguments(directory_source(tmp_path), "9.9")


def test_joined_m_wrappers_and_a_second_dash_dash_are_said_plainly() -> None:
    """`python3 -msglang.launch_server` is a launch, as Python takes it; a wrapper (`uv run`,
    `nohup`) and a second `--` get a line that says what is wrong, not an option's name."""
    options = table(SEED)
    args = ["--model-path", "m", "--tp-size", "2"]
    bare = parse_launch(options, args).given
    assert parse_launch(options, ["python3", "-msglang.launch_server", *args]).given == bare
    for wrapped in (["uv", "run", "python", "-m", "sglang.launch_server"], ["nohup", "python"]):
        with pytest.raises(UsageError, match=r"`\w+ \.\.\.` is no launch of SGLang.*wrappers"):
            parse_launch(options, [*wrapped, *args])
    with pytest.raises(UsageError, match="a second `--` is not one of its options"):
        parse_launch(options, [*args, "--", "--tp", "2"])
