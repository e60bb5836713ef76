"""Small, exact edits on LibCST trees, shared by the patch modules; import them from here.

Split by what they do: `find` locates the code a patch edits (raising `AnchorMissing` instead of
guessing when it is not in the expected shape), `edit` returns changed copies laid out like the
code around them, `walking` visits nodes fast.
"""

from __future__ import annotations

import libcst as cst

from sglpatch.cst_tools.edit import (
    append_to_class,
    replace,
    replace_statement,
    statement,
    with_alias,
    with_branch_before,
    with_imported_name,
    with_row_after,
    with_statements_beside,
)
from sglpatch.cst_tools.find import (
    assigns_self_attribute,
    class_body,
    dict_row,
    find_class,
    find_dict,
    find_function,
    function_body,
    if_chain,
    if_chains,
    ifs_testing,
    imported_names,
    int_key,
    method_calls_on,
    method_names,
    methods,
)
from sglpatch.cst_tools.walking import Step, T, find_compound, walk
from sglpatch.cst_tools.walking import _walk as _walk  # private; plugins copied it from patches
from sglpatch.patch_errors import AnchorMissing

__all__ = [
    "AnchorMissing",
    "Step",
    "T",
    "append_to_class",
    "assigns_self_attribute",
    "class_body",
    "cst",
    "dict_row",
    "find_class",
    "find_compound",
    "find_dict",
    "find_function",
    "function_body",
    "if_chain",
    "if_chains",
    "ifs_testing",
    "imported_names",
    "int_key",
    "method_calls_on",
    "method_names",
    "methods",
    "replace",
    "replace_statement",
    "statement",
    "walk",
    "with_alias",
    "with_branch_before",
    "with_imported_name",
    "with_row_after",
    "with_statements_beside",
]
