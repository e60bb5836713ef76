"""A launch command, parsed as the release's own parser would parse it, without its side effects.

The parser is `argparse` built from the release's `ArgumentTable` as `prepare_server_args`
builds SGLang's (`argparse.ArgumentParser()`: abbreviations allowed, so `--tp 2` is `--tp-size 2`
where no other option starts with `--tp`), but it never prints or exits: every complaint is a
one-line `UsageError` naming the release.
"""

from __future__ import annotations

import argparse
import enum
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from sglpatch.doctor.launch.source import UNKNOWN
from sglpatch.doctor.launch.table import MISSING_DEFAULT, ArgumentTable, Option
from sglpatch.errors import UsageError

_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?")
_MODULE = "sglang.launch_server"
_PYTHON_VALUED = {"-X", "-W", "-Q"}  # interpreter options that take the next word
_ENV_VALUED = {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}


class Origin(enum.Enum):
    """Where a flag's value came from."""

    GIVEN = "given"  # on the launch line
    DEFAULT = "default"  # the release's default, read from its source
    UNKNOWN_DEFAULT = "unknown default"  # not given, and the default is not readable


class Value(NamedTuple):
    value: object
    origin: Origin


@dataclass(frozen=True)
class Launch:
    """One launch as SGLang `release` would read it.

    model_path  `--model-path` (or `--model`, or `sglang serve MODEL`); None when not given
    values      every option's value by its `dest`, with where it came from
    argv        the arguments as given, command words included
    environ     `VAR=value` words before the command (`env VAR=... python -m ...`)

    A `--config FILE` is kept as given and not read: the options in that YAML file (which
    SGLang merges in before parsing) show here as their defaults.
    """

    release: str
    model_path: str | None
    values: Mapping[str, Value]
    argv: tuple[str, ...]
    environ: Mapping[str, str]
    table: ArgumentTable

    def value(self, name: str) -> object:
        """The value of `--flag` (any of its spellings), of a dest or of a `ServerArgs` field
        (`tp_size` in every release); KeyError when the release has no such option."""
        return self.get(name).value

    def get(self, name: str) -> Value:
        option = self.table.option(name)
        if option is None:
            raise KeyError(name)
        return self.values[option.dest]

    @property
    def given(self) -> dict[str, object]:
        return {dest: v.value for dest, v in self.values.items() if v.origin is Origin.GIVEN}


def parse_launch(
    table: ArgumentTable,
    argv: Sequence[str],
    serve: ServeForm | None = None,
    *,
    model_given: bool = False,
) -> Launch:
    """Parse `argv` (the launch's arguments, or the whole command) with `table`.

    `serve`: what the release's `sglang serve` does to its arguments (`serve_form`); None when
    the release has no `sglang serve`, which is then an error.
    Raises UsageError (one line) for an option the release does not know, a bad value or choice,
    or a missing required option (but `--model-path` when `model_given`: doctor's own --model or
    --model-path names the model).
    """
    words = list(argv)
    environ, rest = _environment(words)
    rest = _command_stripped(table.release, rest, serve)
    parser = _parser(table)
    try:
        namespace, extra = parser.parse_known_args(rest)
    except argparse.ArgumentError as error:
        raise UsageError(f"SGLang {table.release}: {_one_line(str(error))}") from None
    for word in extra:
        if word == "--":
            raise UsageError(
                "what follows `--` is the launch: a second `--` is not one of its options"
            )
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            raise UsageError(f"SGLang {table.release} has no launch option {name}")
        if not extra[0].startswith("-") and word == extra[0] and rest and rest[0] == word:
            raise UsageError(  # `uv run python ...`, `nohup python ...`, a script
                f"`{word} ...` is no launch of SGLang: give doctor the `python -m "
                "sglang.launch_server ...` (or `sglang serve ...`) line, without wrappers"
            )
        raise UsageError(f"SGLang {table.release}'s launch takes no argument {word!r}")
    given = vars(namespace)
    missing = [
        o.flags[0]
        for o in table
        if o.required and o.dest not in given and not (model_given and o.dest == "model_path")
    ]
    if missing:  # checked here, after the unknown words: those are the likelier mistake
        raise UsageError(f"SGLang {table.release}'s launch needs {', '.join(missing)}")
    values: dict[str, Value] = {}
    for option in table:
        if option.dest in values and option.dest not in given:
            continue  # an alias spelled apart (a deprecated flag) of an option already read
        if option.dest in given:
            values[option.dest] = Value(given[option.dest], Origin.GIVEN)
        elif option.default is UNKNOWN:
            values[option.dest] = Value(None, Origin.UNKNOWN_DEFAULT)
        elif option.default == argparse.SUPPRESS:
            continue  # absent unless given: the option sharing its dest says the default
        else:
            default = None if option.default == MISSING_DEFAULT else option.default
            values[option.dest] = Value(default, Origin.DEFAULT)
    model = values.get("model_path")
    model_path = model.value if model is not None and isinstance(model.value, str) else None
    return Launch(table.release, model_path, values, tuple(argv), environ, table)


class ServeForm(NamedTuple):
    """What `sglang serve` does to its arguments before SGLang's parser sees them
    (`sglang/cli/serve.py`): from 0.5.10 `--model-type X` picks a backend and is removed; from
    0.5.16 a first word that is no option is the model path."""

    strips_model_type: bool
    positional_model: bool


def serve_form(serve_source: bytes | None) -> ServeForm | None:
    """Read from the release's `sglang/cli/serve.py` (None: the release has no `sglang serve`)."""
    if serve_source is None:
        return None
    return ServeForm(
        strips_model_type=b"--model-type" in serve_source,
        positional_model=b"_normalize_positional_model_path" in serve_source,
    )


def _environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """`env [-i] [-u NAME] A=1 B=2 cmd ...` or `A=1 cmd ...`: the assignments, and the command."""
    environ: dict[str, str] = {}
    index = 0
    if words[:1] == ["env"]:
        index = 1
        while index < len(words) and words[index].startswith("-"):
            index += 2 if words[index] in _ENV_VALUED else 1  # env's own options
    while index < len(words) and _ENV_ASSIGNMENT.match(words[index]):
        name, value = words[index].split("=", 1)
        environ[name] = value
        index += 1
    return environ, words[index:]


def _command_stripped(release: str, words: list[str], serve: ServeForm | None) -> list[str]:
    """The arguments after `python[3] [options] -m sglang.launch_server` or `sglang serve`."""
    if words and _PYTHON.fullmatch(words[0]):
        index = 1
        while index < len(words) and words[index] != "-m":
            if not words[index].startswith("-"):  # a script, not a module: not SGLang's launch
                raise UsageError(f"`{' '.join(words[: index + 1])}` is no launch of SGLang")
            if words[index].startswith("-m"):  # `-msglang.launch_server`, as Python takes it
                words = [*words[:index], "-m", words[index][2:], *words[index + 1 :]]
                break
            index += 2 if words[index] in _PYTHON_VALUED else 1  # the interpreter's options
        module = words[index + 1] if index + 1 < len(words) else ""
        if module != _MODULE:
            raise UsageError(f"`{' '.join(words[: index + 2])}` is no launch of SGLang")
        return words[index + 2 :]
    if words[:2] == ["-m", _MODULE]:
        return words[2:]
    if words[:1] and words[0].split("/")[-1] == "sglang":
        if words[1:2] != ["serve"]:
            raise UsageError(f"`{' '.join(words[:2])}` is no launch of SGLang (sglang serve ...)")
        if serve is None:
            raise UsageError(
                f"SGLang {release} has no `sglang serve`: use python -m sglang.launch_server"
            )
        rest = words[2:]
        if serve.strips_model_type:
            rest = _without_model_type(rest)
        if serve.positional_model and rest and not rest[0].startswith("-"):
            rest = ["--model-path", *rest]
        return rest
    return words


def _without_model_type(words: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--model-type":
            skip = True
        elif not word.startswith("--model-type="):
            kept.append(word)
    return kept


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing and exiting (before Python 3.12 `exit_on_error=False` still
    exits on unrecognised arguments and on missing required ones)."""

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


@functools.lru_cache(maxsize=64)  # some 500 options: 9 ms to build; parsing does not change it
def _parser(table: ArgumentTable) -> argparse.ArgumentParser:
    parser = _Parser(prog="sglang serve", add_help=False, allow_abbrev=True, exit_on_error=False)
    for option in table:
        parser.add_argument(*option.flags, **_keywords(option))
    return parser


class _Refused(argparse.Action):
    """A retired flag SGLang stops at (`parser.error(error_message)`)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise argparse.ArgumentError(self, self.help or "retired")


def _keywords(option: Option) -> dict[str, Any]:
    common: dict[str, Any] = {"dest": option.dest, "default": argparse.SUPPRESS}
    action = option.action
    if option.refusal is not None:
        return {**common, "action": _Refused, "nargs": 0, "help": option.refusal}
    if action in ("store_true", "store_false", "count"):
        return {**common, "action": action}
    if action == "boolean_optional":
        return {**common, "action": argparse.BooleanOptionalAction}
    if option.nargs == 0 or action in ("store_const", "append_const"):
        const = True if option.const is None else option.const
        return {
            **common,
            "action": "append_const" if action == "append_const" else "store_const",
            "const": const,
        }
    keywords: dict[str, Any] = {
        **common,
        "action": "append" if action in ("append", "extend") else "store",
    }
    if option.nargs is not None:
        keywords["nargs"] = option.nargs
    keywords["type"] = _converter(option.type)
    if isinstance(option.choices, tuple) and option.choices:
        keywords["choices"] = option.choices
    return keywords


def human_readable_int(text: str) -> int:
    """SGLang's `human_readable_int`: `32k`, `1M`, `1_000`."""
    cleaned = text.strip().replace("_", "")
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3}.get(cleaned[-1:].lower(), 1)
    number = float(cleaned[:-1] if scale != 1 else cleaned)
    return int(number * scale)


def _nullable(text: str) -> str | None:
    return None if text.lower() in ("none", "null", "") else text


_CONVERTERS: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "json": json.loads,
    "human_readable_int": human_readable_int,
    "nullable_str": _nullable,
}


def _converter(kind: str) -> Callable[[str], object]:
    return _CONVERTERS.get(kind, str)  # an unknown converter: the word as given


def _one_line(message: str) -> str:
    return " ".join(message.split())
