"""`ServerArgs`' fields as a release declares them, and the options SGLang derives from them.

From 0.5.14 `ServerArgs.add_cli_args` starts with `add_cli_args_from_dataclass(parser,
ServerArgs)` (`sglang/srt/arg_groups/arg_utils.py`): every field annotated `A[T, "help"]` or
`A[T, Arg(...)]` becomes an option. Up to 0.5.19 the fields are `ServerArgs`' own (a dataclass in
`srt/server_args.py`); from 0.5.20 `ServerArgs` is assembled from the namespace classes listed
in `_INPUT_NAMESPACES` (`srt/arg_groups/fields/*.py`, msgspec Structs). `derived_option` follows
that function's branches (custom action, Literal, list, bool, scalar) as 0.5.14-0.5.23 write
them: the same in every release but for `record_fields`, which reads Structs too.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from sglpatch.doctor.launch.source import UNKNOWN, Modules, Unknown
from sglpatch.doctor.launch.table import MISSING_DEFAULT, Option

SERVER_ARGS = "sglang/srt/server_args.py"
_FACTORIES: dict[str, object] = {"list": [], "dict": {}, "set": [], "tuple": ()}


class Field(NamedTuple):
    name: str
    annotation: ast.expr
    default: object  # a literal, MISSING_DEFAULT, or UNKNOWN
    path: str
    line: int


def server_args_fields(modules: Modules) -> dict[str, Field]:
    """`ServerArgs`' fields by name: its own class body, then the namespace classes it is
    assembled from (0.5.20 and later)."""
    fields: dict[str, Field] = {}
    tree = modules.tree(SERVER_ARGS)
    if tree is None:
        return fields
    server_args = _class(tree, "ServerArgs")
    if server_args is not None:
        fields.update(class_fields(modules, SERVER_ARGS, server_args))
    for namespace in _namespaces(tree):
        found = _imported_class(modules, namespace)
        if found is not None:
            path, node = found
            for name, field in class_fields(modules, path, node).items():
                fields.setdefault(name, field)
    return fields


def class_fields(modules: Modules, path: str, node: ast.ClassDef) -> dict[str, Field]:
    fields: dict[str, Field] = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(statement.annotation):
            continue
        name = statement.target.id
        default = _default(modules, path, statement.value)
        fields[name] = Field(name, statement.annotation, default, path, statement.lineno)
    return fields


def _default(modules: Modules, path: str, value: ast.expr | None) -> object:
    if value is None:
        return MISSING_DEFAULT
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return modules.value(keyword.value, path)
            if keyword.arg == "default_factory":
                factory = keyword.value
                if isinstance(factory, ast.Name) and factory.id in _FACTORIES:
                    return _FACTORIES[factory.id]
                if isinstance(factory, ast.Lambda):
                    return modules.value(factory.body, path)
                return UNKNOWN
        return MISSING_DEFAULT
    return modules.value(value, path)


def derived_option(modules: Modules, field: Field) -> Option | None:
    """The option `add_cli_args_from_dataclass` adds for `field`; None when it adds none."""
    meta = _metadata(field.annotation)
    if meta is None:
        return None
    inner, arg = meta
    kw = {k.arg: k.value for k in arg.keywords if k.arg} if isinstance(arg, ast.Call) else {}

    def value(name: str) -> object:
        return modules.value(kw[name], field.path) if name in kw else None

    if value("no_cli") is True:
        return None
    cli_name = value("cli_name") or "--" + field.name.replace("_", "-")
    aliases = value("aliases") or []
    if not isinstance(cli_name, str) or not isinstance(aliases, (list, tuple)):
        return None  # not literal: its spelling cannot be known
    flags = (cli_name, *(str(a) for a in aliases))
    base = Option(flags, field.name, default=field.default, origin=f"{field.path}:{field.line}")
    given_choices = _choices(value("choices")) if "choices" in kw else None
    type_parser = _type_name(kw["type_parser"]) if "type_parser" in kw else None
    if "action" in kw:  # its own action: only the action's keywords (`action_kwargs`)
        extra = kw.get("action_kwargs")
        extra_kw = (
            {
                k.value: v
                for k, v in zip(extra.keys, extra.values, strict=True)
                if isinstance(k, ast.Constant)
            }
            if isinstance(extra, ast.Dict)
            else {}
        )
        nargs = modules.value(extra_kw["nargs"], field.path) if "nargs" in extra_kw else None
        action = _action_name(kw["action"])
        kind = _type_name(extra_kw["type"]) if "type" in extra_kw else _flag_type(action)
        return base._replace(action=action, nargs=_nargs(nargs), type=kind)
    inner, _ = _unwrap_optional(inner)
    const = value("const")
    literal = _literal(modules, field.path, inner)
    if literal is not None:
        choices = given_choices if given_choices else tuple(literal)
        kind = type_parser or _scalar(type(literal[0]).__name__ if literal else "str")
        return base._replace(type=kind, choices=choices, const=const)
    if _is_list(inner) and type_parser is None:
        element = _subscript_arg(inner)
        nargs = value("nargs") or "+"
        kind = _scalar(ast.unparse(element)) if element is not None else "str"
        return base._replace(nargs=_nargs(nargs), type=kind, choices=given_choices, const=const)
    if ast.unparse(inner) == "bool":
        return base._replace(action="store_true", type="bool")
    required = value("required")
    if required is None:
        required = field.default == MISSING_DEFAULT
    return base._replace(
        type=type_parser or _scalar(ast.unparse(inner)),
        choices=given_choices,
        nargs=_nargs(value("nargs")),
        const=const,
        required=bool(required),
    )


def _metadata(annotation: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """`A[T, Arg(...)]` / `A[T, "help"]` → (T, the first Arg or help string); else None."""
    if not isinstance(annotation, ast.Subscript):
        return None
    if ast.unparse(annotation.value).split(".")[-1] not in ("A", "Annotated"):
        return None
    elements = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    for meta in elements[1:]:
        if isinstance(meta, ast.Call) and ast.unparse(meta.func).split(".")[-1] == "Arg":
            return elements[0], meta
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return elements[0], meta
    return None


def _unwrap_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Optional":
        return node.slice, True
    members: list[ast.expr] = []
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Union":
        members = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [node.left, node.right]
    real = [m for m in members if ast.unparse(m) != "None"]
    if members and len(real) == 1:
        return real[0], True
    return node, False


def _literal(modules: Modules, path: str, node: ast.expr) -> list[object] | None:
    if not (
        isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Literal"
    ):
        return None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return [modules.value(item, path) for item in items]


def _is_list(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and ast.unparse(node.value) in (
        "list",
        "List",
        "typing.List",
    )


def _subscript_arg(node: ast.expr) -> ast.expr | None:
    return node.slice if isinstance(node, ast.Subscript) else None


def _choices(value: object) -> tuple[object, ...] | Unknown | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return UNKNOWN


def _scalar(name: str) -> str:
    """`_infer_type_func`: str, int and float as they are, anything else read as a string."""
    return name if name in ("str", "int", "float", "bool") else "str"


def _nargs(value: object) -> str | int | None:
    return value if isinstance(value, (str, int)) else None


def _flag_type(action: str) -> str:
    return "bool" if action in ("store_true", "store_false", "boolean_optional") else "str"


def type_name(node: ast.expr) -> str:
    """A `type=` converter by what it reads as: `json.loads` and `json_list_type` → json."""
    return _type_name(node)


def _type_name(node: ast.expr) -> str:
    text = ast.unparse(node)
    if text in ("json.loads", "json_list_type"):
        return "json"
    return text.split(".")[-1]


def action_name(node: ast.expr) -> str:
    return _action_name(node)


def _action_name(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    text = ast.unparse(node).split(".")[-1]
    return "boolean_optional" if text == "BooleanOptionalAction" else text


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _namespaces(tree: ast.Module) -> list[str]:
    """The class names of `_INPUT_NAMESPACES = [Model, ...]` (0.5.20 and later), else []."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    return []


def _imported_class(modules: Modules, name: str) -> tuple[str, ast.ClassDef] | None:
    """Where `server_args.py`'s name `name` is defined as a class: its module and node."""
    tree = modules.tree(SERVER_ARGS)
    if tree is None:
        return None
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
            continue
        if any((a.asname or a.name) == name for a in node.names):
            path = modules.module_path(node.module)
            found = modules.tree(path) if path else None
            klass = _class(found, name) if found else None
            if path and klass is not None:
                return path, klass
    return None
