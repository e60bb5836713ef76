"""What doctor knows, as data with its sources and no machinery: the GPUs it answers for
(`gpus`), SGLang's device helpers and entry points (`sglang`), and which capabilities each
backend or kernel family runs on (`kernel_support`, its table in `kernel_support.json`).

Patches, doctor and the maintainer scripts read these; a fact is written here once.
"""
