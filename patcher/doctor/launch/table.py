"""A release's launch options as its own `add_cli_args` declares them: one row per option."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from sglpatch.doctor.launch.source import Unknown

# A field with no default: argparse then asks for the option (`required`), or leaves None.
MISSING_DEFAULT = "<missing>"


class Option(NamedTuple):
    """One `parser.add_argument(...)` of a release, as far as its source can be read.

    flags     the option strings, as declared (`--tp-size`, `--tensor-parallel-size`)
    dest      where argparse stores it (the `ServerArgs` field)
    action    `store`, `store_true`, `store_false`, `store_const`, `append`, `count`,
              `boolean_optional` (argparse.BooleanOptionalAction), or SGLang's own action class
              by name (`DeprecatedAction`, `DeprecatedStoreTrueAction`, `LoRAPathAction`, ...)
    nargs     as declared (None, "?", "*", "+", or a number)
    type      `str`, `int`, `float`, `json`, `bool` (for flags), or the converter's own name
              (`human_readable_int`, `nullable_str`, ...)
    choices   the allowed values; None: any; UNKNOWN: computed where this reader cannot see
    default   the value SGLang's parser gives when the option is absent (the `ServerArgs`
              field default it names), UNKNOWN where not readable
    required  argparse's `required`
    const     argparse's `const` (`store_const` and SGLang's `const_value`)
    origin    the file and line declaring it ("sglang/srt/server_args.py:3120")
    refusal   the message a retired flag stops the launch with (`DeprecatedAction`'s
              `error_message`), or None
    """

    flags: tuple[str, ...]
    dest: str
    action: str = "store"
    nargs: str | int | None = None
    type: str = "str"
    choices: tuple[object, ...] | Unknown | None = None
    default: object = None
    required: bool = False
    const: object = None
    origin: str = ""
    refusal: str | None = None


@dataclass(frozen=True, eq=False)  # one table per release read: compared (and cached) by identity
class ArgumentTable:
    """Every launch option `release` declares, in declaration order.

    renamed  `ServerArgs` field → the dest argparse stores it under, where they differ: up to
             0.5.13 `--tensor-parallel-size` is stored as `tensor_parallel_size` and
             `ServerArgs.from_cli_args` copies it to `tp_size` (`args.tp_size = args.
             tensor_parallel_size`), so `option("tp_size")` finds it as SGLang's code names it
    """

    release: str
    options: tuple[Option, ...]
    renamed: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Option]:
        return iter(self.options)

    def option(self, name: str) -> Option | None:
        """The option declaring `--flag`, storing into `dest`, or setting the `ServerArgs`
        field `name`; None when there is none."""
        for option in self.options:
            if name in option.flags:
                return option
        dest = self.renamed.get(name, name)
        for option in self.options:
            if option.dest == dest:
                return option
        return None

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(flag for option in self.options for flag in option.flags)
