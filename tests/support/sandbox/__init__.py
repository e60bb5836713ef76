"""The sandbox `tests.support.census` runs a release's ServerArgs resolution in: an import finder
serving the release's modules from its wheel (`finder`), run whole or lifted name by name
(`lifting`), stand-ins for torch and third-party modules whose unknown values log every decision
taken with them (`stand_ins`, `msgspec_stand_in`), and the stand-in ModelConfig (`model`)."""
