"""A release's launch options, read from its own `ServerArgs.add_cli_args` (never imported).

Where the definitions live, 0.5.3-0.5.23 (read in each release's `sglang/srt/server_args.py`):
- 0.5.3-0.5.13: every option is a literal `parser.add_argument("--flag", ..., default=
  ServerArgs.field)` inside `add_cli_args`; no loops, no `**kwargs`; choices are literal lists or
  module-level names (`ATTENTION_BACKEND_CHOICES`); the reasoning and tool-call parsers' choices
  are computed from registries (`list(ReasoningParser.DetectorMap.keys())`): unknown here.
- 0.5.14-0.5.23: `add_cli_args_from_dataclass(parser, ServerArgs)` first (see `fields.py`), then
  a few literal `add_argument` calls (dynamic choices, `--config`, deprecated spellings, whose
  defaults are `ServerArgs.field` or, from 0.5.20, `_declared_default("field")`). From 0.5.19 an
  `if envs.SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE.get()` adds one sampling backend: the choices
  read here are those without it.
Every release builds its parser as `argparse.ArgumentParser()` (`prepare_server_args`), so
abbreviations are allowed, as `parse.py` allows them.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Callable, Mapping

from sglpatch.doctor.launch.fields import (
    SERVER_ARGS,
    Field,
    action_name,
    derived_option,
    server_args_fields,
    type_name,
)
from sglpatch.doctor.launch.source import UNKNOWN, Modules, Source
from sglpatch.doctor.launch.table import ArgumentTable, Option
from sglpatch.errors import TargetError

_FROM_DATACLASS = "add_cli_args_from_dataclass"
# argparse's own default per action, where `add_argument` names none.
_IMPLICIT = {"store_true": False, "store_false": True, "count": None}


def read_arguments(
    source: Source, release: str, parse: Callable[[bytes], ast.Module] = ast.parse
) -> ArgumentTable:
    """Every option `release`'s `ServerArgs.add_cli_args` declares, in its order.

    `parse`: how a file's bytes become a tree (`ast.parse`, or a caller's cache of trees).
    Raises TargetError when the release has no `server_args.py` or no `add_cli_args` in it.
    """
    modules = Modules(source, parse)
    tree = modules.tree(SERVER_ARGS)
    if tree is None:
        raise TargetError(f"SGLang {release}: no server_args.py", SERVER_ARGS)
    body = _add_cli_args(tree)
    if body is None:
        raise TargetError(f"SGLang {release}: no ServerArgs.add_cli_args", SERVER_ARGS)
    fields = server_args_fields(modules)
    options: list[Option] = []
    local: dict[str, object] = {}
    for statement in _statements(body.body):
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                local[target.id] = modules.value(statement.value, SERVER_ARGS, local)
            continue
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            continue
        call = statement.value
        called = ast.unparse(call.func)
        if called.endswith(".add_argument"):
            option = _declared(modules, call, fields, local)
            if option is not None:
                options.append(option)
        elif called.split(".")[-1] == _FROM_DATACLASS:
            for field in fields.values():
                derived = derived_option(modules, field)
                if derived is not None:
                    options.append(derived)
    return ArgumentTable(release, tuple(options), _renamed(tree))


def _method(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _add_cli_args(tree: ast.Module) -> ast.FunctionDef | None:
    return _method(tree, "add_cli_args")


def _renamed(tree: ast.Module) -> dict[str, str]:
    """`args.tp_size = args.tensor_parallel_size` in `ServerArgs.from_cli_args` (up to
    0.5.13): field `tp_size` is read from dest `tensor_parallel_size`."""
    method = _method(tree, "from_cli_args")
    renamed: dict[str, str] = {}
    for node in ast.walk(method) if method is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Attribute)
                and isinstance(value, ast.Attribute)
                and ast.unparse(target.value) == ast.unparse(value.value) == "args"
            ):
                renamed[target.attr] = value.attr
    return renamed


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements in order, those under an `if` included (its test is not evaluated: the
    only one, from 0.5.19, adds a choice to a local set, which this reader leaves out)."""
    found: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, ast.If):
            found += _statements(statement.body) + _statements(statement.orelse)
        else:
            found.append(statement)
    return found


def _declared(
    modules: Modules, call: ast.Call, fields: Mapping[str, Field], local: Mapping[str, object]
) -> Option | None:
    flags = tuple(
        a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
    )
    if len(flags) != len(call.args) or not flags or not all(f.startswith("-") for f in flags):
        return None  # a positional, or a name computed at run time: not a launch option read here
    kw = {k.arg: k.value for k in call.keywords if k.arg}

    def value(name: str) -> object:
        return modules.value(kw[name], SERVER_ARGS, local) if name in kw else None

    action = action_name(kw["action"]) if "action" in kw else "store"
    dest = value("dest")
    if not isinstance(dest, str):
        long = next((f for f in flags if f.startswith("--")), flags[0])
        dest = long.lstrip("-").replace("-", "_")
    if "default" in kw:
        default = _default_of(modules, kw["default"], fields, local)
    else:
        default = _IMPLICIT.get(action)
        if action == "DeprecatedStoreTrueAction":
            default = False
    choices = value("choices")
    const = value("const") if "const" in kw else value("const_value")
    nargs = value("nargs")
    refusal = value("error_message")
    if action in ("DeprecatedAction", "DeprecatedStoreTrueAction") or (
        action == "DeprecatedStoreConstAction" and "nargs" not in kw
    ):
        nargs = 0  # these actions take no value unless their call says otherwise
    if "type" in kw:
        kind = type_name(kw["type"])
    else:
        kind = "bool" if action in ("store_true", "store_false", "boolean_optional") else "str"
    return Option(
        flags=flags,
        dest=dest,
        action=action,
        nargs=nargs if isinstance(nargs, (str, int)) else None,
        type=kind,
        choices=None
        if choices is None
        else tuple(choices)
        if isinstance(choices, (list, tuple, set))
        else UNKNOWN,
        default=default,
        required=value("required") is True,
        const=const,
        origin=f"{SERVER_ARGS}:{call.lineno}",
        refusal=refusal if action == "DeprecatedAction" and isinstance(refusal, str) else None,
    )


def _default_of(
    modules: Modules, node: ast.expr, fields: Mapping[str, Field], local: Mapping[str, object]
) -> object:
    """`ServerArgs.x` and `_declared_default("x")` → field x's default; else the literal."""
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "ServerArgs":
        field = fields.get(node.attr)
        return field.default if field is not None else UNKNOWN
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "_declared_default"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        field = fields.get(str(node.args[0].value))
        return field.default if field is not None else UNKNOWN
    found = modules.value(node, SERVER_ARGS, local)
    return argparse.SUPPRESS if found == argparse.SUPPRESS else found
