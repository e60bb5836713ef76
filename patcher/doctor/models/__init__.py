"""Which model the user asked doctor about, resolved in one place: an architecture
(`KimiK25ForConditionalGeneration`), a models module's stem (`kimi_k25`), a Hugging Face id read
in the local hub cache (`hub`), or a checkpoint folder whose config.json names it (`asked`).
"""
