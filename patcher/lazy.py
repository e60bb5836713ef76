"""Import a module on first attribute access, so `status` and `list` never pay for libcst.

The stand-in `lazy_import` returns is not put in `sys.modules`: the first name asked of it
imports the module there by the ordinary import system. importlib's `LazyLoader` registered a
module whose code had not run yet, and any `import libcst` (a plugin's) then ran that code
inside CPython's import statement, which discards whatever is raised while it reads the
module's `__spec__`: a Ctrl-C there vanished and left a half-run libcst in `sys.modules`, whose
missing names were an AttributeError later (exit 70 instead of 130). An ordinary import raises
what interrupts it and takes its half-run module out of `sys.modules`, so the next use imports
it anew.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from sglpatch.errors import interrupted


class _OnFirstUse(ModuleType):
    """Stands for a module until one of its names is asked for, then holds its names."""

    def __getattr__(self, name: str) -> Any:  # only for names not copied in yet
        try:
            module = importlib.import_module(self.__name__)
        except Exception as error:
            if interrupted(error):  # a Ctrl-C Python turned into another error: still one
                raise KeyboardInterrupt from error
            raise
        # Copied once: later look-ups cost what a module's own do (libcst's nodes are asked
        # for in every codemod). A name the module gains afterwards (a submodule imported
        # later) is still found here.
        vars(self).update(vars(module))
        return getattr(module, name)


def lazy_import(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec(name) is None:
        raise ImportError(f"no module named {name!r}")
    return _OnFirstUse(name)
