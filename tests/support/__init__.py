"""What the tests share: the real wheels (`wheels`), the releases they use (`releases`), the crash
driver (`crashing`), proofs read off patched sources (`proofs`), stand-ins for the kernels and
machines SGLang's decision code asks about (`stand_ins_*`), and the per-patch matrix hooks'
type (`matrix`)."""
