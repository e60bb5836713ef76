"""msgspec as SGLang 0.5.19+ uses it to build ServerArgs (it is not installed here), and the
defaults of ServerArgs' fields read either way."""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

_NODEFAULT = type("NoDefault", (), {"__repr__": lambda self: "NODEFAULT"})()


@dataclasses.dataclass(frozen=True)
class _StructField:
    name: str
    default: Any = _NODEFAULT
    default_factory: Any = _NODEFAULT
    type: Any = Any


def msgspec_module() -> types.ModuleType:
    """msgspec (0.5.19+ build ServerArgs with it; not installed here): Struct, field,
    defstruct and structs.fields/asdict/replace, with msgspec's meaning for defaults."""

    class Struct:
        __struct_fields__: tuple[str, ...] = ()
        _census_fields: tuple[_StructField, ...] = ()

        def __init_subclass__(cls, **options: Any) -> None:
            found: dict[str, _StructField] = {}
            for base in reversed(cls.__mro__[1:]):
                for f in getattr(base, "_census_fields", ()):
                    found[f.name] = f
            for name, hint in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
                value = cls.__dict__.get(name, _NODEFAULT)
                if isinstance(value, _StructField):
                    found[name] = dataclasses.replace(value, name=name, type=hint)
                else:
                    found[name] = _StructField(name, value, type=hint)
            cls._census_fields = tuple(found.values())
            cls.__struct_fields__ = tuple(found)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for f, value in zip(self._census_fields, args, strict=False):
                kwargs[f.name] = value
            for f in self._census_fields:
                if f.name in kwargs:
                    value = kwargs[f.name]
                elif f.default_factory is not _NODEFAULT:
                    value = f.default_factory()
                elif f.default is not _NODEFAULT:
                    value = f.default
                else:
                    raise TypeError(f"missing {f.name}")
                object.__setattr__(self, f.name, value)

        __setattr__ = object.__setattr__

    def field(
        *, default: Any = _NODEFAULT, default_factory: Any = _NODEFAULT, name: Any = None
    ) -> _StructField:
        return _StructField("", default, default_factory)

    def defstruct(
        name: str, fields: Any, *, bases: Any = None, namespace: Any = None, **kw: Any
    ) -> type:
        body = dict(namespace or {})
        annotations = {}
        for entry in fields:
            entry = (entry,) if isinstance(entry, str) else tuple(entry)
            annotations[entry[0]] = entry[1] if len(entry) > 1 else Any
            if len(entry) > 2:
                body[entry[0]] = entry[2]
        body["__annotations__"] = annotations
        return type(name, (*(bases or ()), Struct), body)

    structs = types.ModuleType("msgspec.structs")
    structs.fields = lambda cls: (cls if isinstance(cls, type) else type(cls))._census_fields  # type: ignore[attr-defined]
    structs.asdict = lambda obj: {n: getattr(obj, n) for n in obj.__struct_fields__}  # type: ignore[attr-defined]

    def replace(obj: Any, **changes: Any) -> Any:
        return type(obj)(**{**structs.asdict(obj), **changes})

    structs.replace = replace  # type: ignore[attr-defined]
    module = types.ModuleType("msgspec")
    module.__path__ = []
    module.__dict__.update(
        Struct=Struct, field=field, defstruct=defstruct, structs=structs, NODEFAULT=_NODEFAULT
    )
    return module


def field_defaults(cls: type) -> dict[str, Any]:
    """The defaults of ServerArgs' fields (a default factory is called): a dataclass to 0.5.18,
    a msgspec Struct from 0.5.19."""
    return {name: factory() if factory else value for name, value, factory in _layout(cls)}


@functools.lru_cache(maxsize=4)  # read once per sandbox's class: every model asks for them
def _layout(cls: type) -> tuple[tuple[str, Any, Callable[[], Any] | None], ...]:
    found: list[tuple[str, Any, Callable[[], Any] | None]] = []
    if not dataclasses.is_dataclass(cls):
        for f in cls._census_fields:  # type: ignore[attr-defined]
            if f.default_factory is not _NODEFAULT:
                found.append((f.name, None, f.default_factory))
            elif f.default is not _NODEFAULT:
                found.append((f.name, f.default, None))
        return tuple(found)
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            found.append((field.name, field.default, None))
        elif field.default_factory is not dataclasses.MISSING:
            found.append((field.name, None, field.default_factory))
    return tuple(found)
