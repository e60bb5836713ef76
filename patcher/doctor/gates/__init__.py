"""What each GPU gets at a capability decision in SGLang's source: the interpreter.

`scanner` walks the tree (over `read/`) and hands each module's candidate lines to `reach`,
which finds the decisions (`decisions`), evaluates their tests for each GPU (`evaluator`, over
`devices`: SGLang's helpers and probes as the target defines them) and says which branches each
GPU takes and what they choose (`branches`, `entries`: the backend flags and kernel entry points
of `facts/sglang.py`). `tables` finds tables keyed by capability without a row for 12.
"""
