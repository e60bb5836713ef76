"""What doctor knows, as data with its sources and no machinery: the GPUs it answers for
(`gpus`).
"""
