"""What a branch of SGLang's source chooses, named as the kernel-support table names it.

A branch chooses a backend when it sets one of SGLang's backend flags to a literal
(`self.attention_backend = "fa3"`, `overrides["moe_runner_backend"] = "triton"`,
`replace(args, attention_backend="torch_native")`): `FIELD_KINDS` says which table kind a flag's
value is looked up in. It chooses a kernel when it names one of the entry points below (calls,
imports or returns it). A function or flag that turns a kernel on (`ENABLE_JIT_DEEPGEMM`)
chooses it when it is true. The flags, entry points and kernel flags are data, with their table
keys and sources, in `facts/sglang.py`.
"""

from __future__ import annotations

from sglpatch.doctor.facts import sglang


def field_kind(name: str) -> tuple[str, str] | None:
    """(table kind, record prefix) of a backend flag's name, or None for any other name."""
    for pattern, kind in sglang.FIELD_KINDS:
        if pattern.search(name):
            if kind.startswith("gemm:"):
                return "gemm", kind[len("gemm:") :] + ":"
            return kind, ""
    return None
