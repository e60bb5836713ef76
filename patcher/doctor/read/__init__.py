"""doctor's reading: bytes, lines and syntax trees of the target's files, and all the speed.

`source_tree` reads files within bounds and notes what it cannot read (never importing the
tree), `candidates` finds from the bytes the lines that can hold a capability gate, `chunks`
parses only the statements around them, and `pool` runs the work in worker processes when a
second core and enough work are there. Nothing here judges: what a GPU gets is `gates/`'s.
"""
