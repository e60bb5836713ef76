"""What the user gives doctor beside the tree: the launch they will run, the checkpoint's
quantization, the GPU present. Read with `launch/`'s readers; judged nowhere here.

- The launch (`sglpatch doctor -- LAUNCH...`) is parsed with the target release's own options
  (`launch.arguments`, read from its source); its `--model-path` names the model.
- The quantization is the launch's `--quantization` when given, else the one the checkpoint's
  config.json declares (`launch.quantization`), else `UNQUANTIZED` when that config.json declares
  none; unknown (None) when no config.json was read (`--model` named the architecture).
- The GPU: `--capability` when given; else the capability-12 parts `nvidia-smi` reports; else
  both parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sglpatch.doctor.facts.gpus import CAPABILITIES
from sglpatch.doctor.launch.arguments import read_arguments
from sglpatch.doctor.launch.parse import Launch, Origin, parse_launch, serve_form
from sglpatch.doctor.launch.quantization import checkpoint_quantization, release_rules
from sglpatch.doctor.launch.source import Source, directory_source
from sglpatch.doctor.models.shape import Shape, shape_of
from sglpatch.doctor.report import GpuChoice, Launched
from sglpatch.errors import UsageError
from sglpatch.reading import read_regular

# The quantization of a checkpoint whose config.json declares none (bf16/fp16 weights): no
# quantization patch is on its path. Not one of SGLang's names, which have none for it.
UNQUANTIZED = "unquantized"
# The speculative algorithm whose start-up calls the EAGLE-3 methods doctor checks. EAGLE (and
# NEXTN, which ServerArgs rewrites to EAGLE) runs the same worker, but the EAGLE-3 layer capture
# it needs from the model is under `speculative_algorithm.is_eagle3()` (spec_info.py, 0.5.3-0.5.23).
EAGLE3 = "EAGLE3"
_CONFIG_LIMIT = 64 << 20  # bytes, as models/asked.py reads config.json


def read_launch(
    package_dir: Path, release: str, argv: Sequence[str], model_given: bool = False
) -> Launch:
    """`argv` parsed as `release` (whose `sglang/` is `package_dir`) parses its launch; an option
    it does not know is a one-line UsageError. `model_given`: doctor's --model or --model-path
    names the model, so the launch may leave out its own --model-path."""
    source = directory_source(package_dir.parent)
    table = read_arguments(source, release)
    serve = serve_form(source("sglang/cli/serve.py"))
    return parse_launch(table, argv, serve, model_given=model_given)


def launched(launch: Launch, flags: Iterable[str]) -> Launched:
    """The launch as the answer reports it: the options given, and which of `flags` (the
    patches' `Concerns.flag`s) it passes."""
    spelled: dict[str, str] = {}
    for option in launch.table:
        long = next((f for f in option.flags if f.startswith("--")), option.flags[0])
        spelled.setdefault(option.dest, long)
    given = {spelled[dest]: value for dest, value in launch.given.items() if dest in spelled}
    passed = frozenset(f for f in flags if passes(launch, f))
    # As ServerArgs names them: up to 0.5.13 `--tp 2` is stored as `tensor_parallel_size` and
    # copied to `tp_size` (the table's `renamed`).
    field = {dest: name for name, dest in launch.table.renamed.items()}
    given_fields = [(field.get(d, d), value) for d, value in launch.given.items()]
    fields = tuple((name, value) for name, value in given_fields if name != "model_path")
    return Launched(launch.model_path, given, passed, fields)


def passes(launch: Launch, flag: str) -> bool:
    """Whether the launch passes `flag`: `--enable-torch-symm-mem` (set), or `--moe-runner-backend
    triton_kernel` (that value given). A flag the release does not have is not passed."""
    name, _, wanted = flag.partition(" ")
    try:
        found = launch.get(name)
    except KeyError:
        return False
    if found.origin is not Origin.GIVEN:
        return False
    if wanted:
        return str(found.value) == wanted
    return bool(found.value)


def eagle3_asked(launch: Launch | None, eagle3: bool) -> bool:
    """`--eagle3`, or a launch with `--speculative-algorithm EAGLE3` (any case, as SGLang's
    `SpeculativeAlgorithm.from_string` reads it)."""
    if eagle3 or launch is None:
        return eagle3
    try:
        algorithm = launch.value("--speculative-algorithm")
    except KeyError:
        return False
    return isinstance(algorithm, str) and algorithm.upper() == EAGLE3


def read_config(config: Path | None) -> dict[str, Any] | None:
    """The checkpoint's config.json, read once for everything below (None: none, unreadable)."""
    return _json(config) if config is not None else None


def quantization(
    package_dir: Path,
    config: Path | None,
    loaded: Mapping[str, Any] | None,
    launch: Launch | None,
) -> tuple[str | None, str]:
    """The quantization the model runs with, and where it was read ("" when unknown); `loaded`
    is `config` as `read_config` gave it."""
    if launch is not None:
        try:
            given = launch.get("--quantization")
        except KeyError:
            given = None
        if given is not None and given.origin is Origin.GIVEN and isinstance(given.value, str):
            return given.value, "from the launch's --quantization"
    if config is None or loaded is None:
        return None, ""
    beside = config.parent / "hf_quant_config.json"
    extra = _json(beside) if beside.is_file() else None
    source: Source = directory_source(package_dir.parent)
    found = checkpoint_quantization(loaded, release_rules(source), extra)
    if found is None:
        return UNQUANTIZED, "config.json declares none"
    scheme = f", scheme {found.scheme}" if found.scheme else ""
    return found.method, f"from config.json's {found.where}{scheme}"


def config_fields(loaded: Mapping[str, Any] | None) -> frozenset[str] | None:
    """The fields config.json sets (its text_config's too), for the patches whose
    `Concerns.config` names one (DSA: `index_topk`); None when there is none to read."""
    if loaded is None:
        return None
    text = loaded.get("text_config")
    nested = text if isinstance(text, dict) else {}
    return frozenset(k for k, v in {**nested, **loaded}.items() if v is not None)


def shape(loaded: Mapping[str, Any] | None) -> Shape:
    """The head sizes config.json gives (none: unreadable)."""
    return shape_of(loaded) if loaded is not None else Shape()


def _json(path: Path) -> dict[str, Any] | None:
    """A config file's object; None when it cannot be read (models/asked.py has already said
    why for config.json, which named the model)."""
    try:
        data = json.loads(read_regular(path, _CONFIG_LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def gpu(capabilities: Sequence[str] | None) -> GpuChoice:
    """The parts judged: `capabilities` when the caller names them (--capability); else those
    `nvidia-smi` reports; else both."""
    if capabilities is not None:
        asked = tuple(capabilities)
        return GpuChoice(asked, "--capability" if asked != CAPABILITIES else None)
    from sglpatch.doctor.launch.gpu import present_gpus  # runs nvidia-smi: only when asked

    found = present_gpus()
    present = tuple(f"{major}.{minor}" for major, minor in found.parts)
    twelve = tuple(p for p in present if p in CAPABILITIES)
    if twelve:
        return GpuChoice(twelve, "nvidia-smi", present)
    note = ""
    if present:
        note = (
            f"no capability-12 GPU here ({', '.join(present)} from nvidia-smi): "
            f"judged for {' and '.join(CAPABILITIES)}"
        )
    return GpuChoice(CAPABILITIES, None, present, note)


def model_path(launch: Launch | None, model: str | None, path: Path | None) -> Path | None:
    """The model path: doctor's `--model-path`, or the launch's (giving both, or the launch's
    and `--model`, is a usage error)."""
    if launch is None or launch.model_path is None:
        return path
    if path is not None or model is not None:
        given = "--model-path" if path is not None else "--model"
        raise UsageError(
            f"the launch names the model (--model-path {launch.model_path}): "
            f"give it there or as doctor's {given}, not both"
        )
    return Path(launch.model_path)
