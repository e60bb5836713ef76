"""The built-in catalogue: one module per patch, each holding one `Patch` subclass."""
