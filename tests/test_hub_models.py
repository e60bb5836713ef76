"""`doctor --model ORG/NAME` and `--model-path ORG/NAME`: a Hugging Face id read in the local hub
cache, never the network. The caches here are built as huggingface_hub builds its own: the
files in `blobs/`, each snapshot's config.json a relative symbolic link to one, `refs/main`
naming a revision.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.doctor.models import hub
from sglpatch.doctor.models.asked import model_asked
from sglpatch.errors import ExitCode, UsageError
from tests.support import wheels
from tests.support.releases import SEED

KIMI = "KimiK25ForConditionalGeneration"
KIMI_ID = "moonshotai/Kimi-K2.5"
OLD, NEW = "a" * 40, "b" * 40  # two revisions (commit hashes)
VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture(autouse=True)
def no_hub_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets choose the cache (HOME is the tests' own already)."""
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def cache_model(
    cache: Path,
    repo_id: str,
    config: Any,
    revision: str = OLD,
    *,
    main: bool = True,
    age: float = 0,
) -> Path:
    """One revision of a model in `cache` as huggingface_hub stores it; its config.json link.

    `config` is JSON data, or the file's bytes; `age` (seconds) makes the snapshot older.
    """
    model = cache / f"models--{repo_id.replace('/', '--')}"
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    blob = model / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = model / "snapshots" / revision / "config.json"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..", "..", "blobs", blob.name))
    if age:
        when = link.lstat().st_mtime - age
        os.utime(link, (when, when), follow_symlinks=False)
    if main:
        (model / "refs").mkdir(exist_ok=True)
        (model / "refs" / "main").write_text(revision)  # as the hub writes it: no newline
    return link


def kimi(architecture: str = KIMI) -> dict[str, Any]:
    return {"architectures": [architecture], "model_type": "kimi_k25"}


# --- where the cache is ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "chosen", "said_by"),
    [
        ({}, "home/.cache/huggingface/hub", "the default"),
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub", "$XDG_CACHE_HOME"),
        ({"XDG_CACHE_HOME": "xdg", "HF_HOME": "hf"}, "hf/hub", "$HF_HOME"),
        ({"HF_HOME": "hf", "HUGGINGFACE_HUB_CACHE": "legacy"}, "legacy", "$HUGGINGFACE_HUB_CACHE"),
        ({"HF_HOME": "hf", "HUGGINGFACE_HUB_CACHE": "legacy", "HF_HUB_CACHE": "hub"}, "hub",
         "$HF_HUB_CACHE"),
        ({"HF_HUB_CACHE": "", "HF_HOME": "hf"}, "hf/hub", "$HF_HOME"),  # empty: unset
    ],
    ids=["default", "xdg", "hf-home", "legacy", "hf-hub-cache", "empty"],
)  # fmt: skip
def test_the_cache_is_where_huggingface_hub_puts_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, str],
    chosen: str,
    said_by: str,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable, value in settings.items():
        monkeypatch.setenv(variable, str(tmp_path / value) if value else "")
    every = ["home/.cache/huggingface/hub", "xdg/huggingface/hub", "hf/hub", "legacy", "hub"]
    for folder in every:  # the same model in every cache, each naming a different class
        cache_model(tmp_path / folder, KIMI_ID, kimi(f"Read{every.index(folder)}ForCausalLM"))
    assert hub.cache() == hub.Cache(tmp_path / chosen, said_by)
    assert model_asked(KIMI_ID, None) == (
        f"Read{every.index(chosen)}ForCausalLM",
        tmp_path / chosen / "models--moonshotai--Kimi-K2.5" / "snapshots" / OLD / "config.json",
    )


def test_a_cache_variable_may_name_home_and_other_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", "~/hf")
    assert hub.cache().folder == tmp_path / "hf" / "hub"
    monkeypatch.setenv("MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", "$MODELS/hub")
    assert hub.cache() == hub.Cache(tmp_path / "models" / "hub", "$HF_HUB_CACHE")


# --- which revision --------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def test_refs_main_is_preferred_to_a_newer_snapshot(cache: Path) -> None:
    main = cache_model(cache, KIMI_ID, kimi(), OLD, age=3600)
    newer = cache_model(cache, KIMI_ID, kimi("NewerForCausalLM"), NEW, main=False)
    assert hub.find(KIMI_ID) == hub.Snapshot(KIMI_ID, main, OLD, "refs/main")
    assert model_asked(KIMI_ID, None) == (KIMI, main)
    (cache / "models--moonshotai--Kimi-K2.5" / "refs" / "main").unlink()
    assert hub.find(KIMI_ID) == hub.Snapshot(KIMI_ID, newer, NEW, "the newest snapshot")


def test_refs_main_naming_no_snapshot_falls_back_to_the_newest(cache: Path) -> None:
    cache_model(cache, KIMI_ID, kimi("OlderForCausalLM"), OLD, age=3600, main=False)
    newest = cache_model(cache, KIMI_ID, kimi(), NEW, main=False)
    refs = cache / "models--moonshotai--Kimi-K2.5" / "refs"
    refs.mkdir()
    (refs / "main").write_text("c" * 40)  # a revision whose files were never downloaded
    assert hub.find(KIMI_ID) == hub.Snapshot(KIMI_ID, newest, NEW, "the newest snapshot")
    (refs / "main").write_text("../../../elsewhere")  # never a path: only a snapshot's name
    assert hub.find(KIMI_ID).config == newest


def test_a_snapshot_without_config_json_is_not_chosen(cache: Path) -> None:
    older = cache_model(cache, KIMI_ID, kimi(), OLD, age=3600, main=False)
    weights_only = cache / "models--moonshotai--Kimi-K2.5" / "snapshots" / NEW
    weights_only.mkdir()
    (weights_only / "model.safetensors").symlink_to(Path("..", "..", "blobs", "x"))
    (cache / "models--moonshotai--Kimi-K2.5" / "refs").mkdir()
    (cache / "models--moonshotai--Kimi-K2.5" / "refs" / "main").write_text(NEW)
    assert hub.find(KIMI_ID).config == older


def test_the_id_is_matched_as_the_hub_does_without_regard_to_case(cache: Path) -> None:
    link = cache_model(cache, "MoonshotAI/Kimi-K2.5", kimi())
    assert hub.find(KIMI_ID) == hub.Snapshot("MoonshotAI/Kimi-K2.5", link, OLD, "refs/main")


# --- what is not there, or not readable ------------------------------------------------------


def one_line(error: pytest.ExceptionInfo[UsageError], *words: str) -> str:
    text = str(error.value)
    assert "\n" not in text and all(word in text for word in words), text
    return text


def test_not_cached_says_so_and_how_to_pass_the_model(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where no folder moonshotai/Kimi-K2.5 is
    with pytest.raises(UsageError) as error:
        model_asked(KIMI_ID, None)
    one_line(error, f"--model {KIMI_ID}: not in the local Hugging Face cache",
             f"no hub cache at {cache}, from $HF_HUB_CACHE", "--model-path DIR",
             "--model ARCHITECTURE", f"hf download {KIMI_ID} config.json")  # fmt: skip
    cache_model(cache, "zai-org/GLM-5.3-Flash", kimi())
    with pytest.raises(UsageError) as error:
        model_asked(None, Path(KIMI_ID))
    one_line(error, f"--model-path {KIMI_ID}: no such folder, and not in the local Hugging Face",
             f"no models--moonshotai--Kimi-K2.5 in {cache}")  # fmt: skip
    (cache / "models--moonshotai--Kimi-K2.5" / "snapshots" / OLD).mkdir(parents=True)
    with pytest.raises(UsageError) as error:
        model_asked(KIMI_ID, None)
    one_line(error, "no snapshot in", "holds a config.json")


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("dangling", ["cannot read config.json: a link to nothing"]),
        ("not-json", ["cannot read config.json: Expecting value"]),
        ("no-architectures", ["config.json names no architectures"]),
        ("folder", ["cannot read config.json: not a regular file"]),
    ],
)
def test_an_unreadable_config_json_is_named_with_its_snapshot(
    cache: Path, damage: str, words: list[str]
) -> None:
    config = {"not-json": b"not json", "no-architectures": {"model_type": "kimi_k25"}}.get(
        damage, kimi()
    )
    link = cache_model(cache, KIMI_ID, config)
    if damage == "dangling":  # a blob deleted by hand, or a download cut short
        link.resolve().unlink()
    elif damage == "folder":
        link.unlink()
        link.mkdir()
    with pytest.raises(UsageError) as error:
        model_asked(KIMI_ID, None)
    one_line(error, f"--model {KIMI_ID} (cached as {link})", *words)


# --- which names go to the cache -------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [KIMI_ID, "zai-org/GLM-5.3-Flash", "gpt2", "bert-base-uncased", "a/b_", "_/x.y"]
)
def test_hub_ids(text: str) -> None:
    assert hub.is_repo_id(text)


@pytest.mark.parametrize(
    "text",
    ["", "a/b/c", "kimi/../../x", "../x", "a/..", "org--x/y", "-a/b", "a/b-", "a/.b", "/abs/x",
     "a/", "a" * 97, "\u00fcn\u00ef/x", "a b/c", "\udcff"],
)  # fmt: skip
def test_not_hub_ids(text: str) -> None:
    assert not hub.is_repo_id(text)


def test_an_existing_folder_is_read_as_a_folder(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As SGLang's own --model-path: a folder spelled like a hub id is the folder."""
    cache_model(cache, KIMI_ID, kimi("CachedForCausalLM"))
    checkpoint = tmp_path / "work" / "moonshotai" / "Kimi-K2.5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps(kimi()))
    monkeypatch.chdir(tmp_path / "work")
    assert model_asked(None, Path(KIMI_ID)) == (KIMI, Path(KIMI_ID) / "config.json")
    (checkpoint / "config.json").unlink()
    with pytest.raises(UsageError) as error:  # today's answer for a folder without one
        model_asked(None, Path(KIMI_ID))
    one_line(error, f"--model-path {KIMI_ID}: no config.json there")
    monkeypatch.chdir(tmp_path)  # no such folder here: the cache
    assert model_asked(None, Path(KIMI_ID))[0] == "CachedForCausalLM"


def test_a_bare_hub_name_points_at_its_cached_ids(cache: Path) -> None:
    cache_model(cache, "zai-org/GLM-5.3-Flash", kimi("Glm5ForCausalLM"))
    cache_model(cache, "someone/glm-5.3-flash", kimi("Glm5ForCausalLM"))
    with pytest.raises(UsageError) as error:
        model_asked("GLM-5.3-Flash", None)
    one_line(error, "--model GLM-5.3-Flash looks like a Hugging Face model name",
             "holds someone/glm-5.3-flash, zai-org/GLM-5.3-Flash",
             "pass --model someone/glm-5.3-flash")  # fmt: skip
    cache_model(cache, "bert-base-uncased", kimi("BertModel"))  # an id with no ORG
    assert model_asked("bert-base-uncased", None)[0] == "BertModel"


def test_module_and_class_names_are_not_looked_up(cache: Path) -> None:
    """Identifiers are the models modules' and classes' own names: the census answers them,
    whatever the cache holds; as do names not cached (the census suggests near misses)."""
    cache_model(cache, "someone/kimi_k25", kimi("OtherForCausalLM"))
    cache_model(cache, f"someone/{KIMI}", kimi("OtherForCausalLM"))
    for name in ("kimi_k25", KIMI, "kimi-k2.5", "Unknown-Model-7B"):
        assert model_asked(name, None) == (name, None)
    assert model_asked(None, None) == (None, None)


# --- end to end on the real 0.5.9 ------------------------------------------------------------


@pytest.fixture(scope="module")
def tree_059(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree(SEED, tmp_path_factory.mktemp("tree-059"))


def doctor(tree: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["doctor", "--target", str(tree), *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.wheel
def test_doctor_reads_the_model_from_the_hub_cache(tree_059: Path, cache: Path) -> None:
    cache_model(cache, KIMI_ID, kimi())
    code, out, err = doctor(tree_059, "--json", "--model", KIMI_ID, "--eagle3")
    assert code == ExitCode.GAPS, err
    report = json.loads(out)
    assert report["model"] == KIMI
    assert report["model_from"].startswith(str(cache)) and report["model_from"].endswith(
        "/config.json"
    )  # said where it was read
    assert report["verdict"].startswith(f"capability 12 + EAGLE-3 on {KIMI} (SGLang {SEED}): ")
    (missing,) = [b for b in report["blockers"] if b["source"] == KIMI]
    assert "get_embed_and_head" in missing["what"]
    code, by_path, err = doctor(tree_059, "--json", "--model-path", KIMI_ID, "--eagle3")
    assert code == ExitCode.GAPS, err
    assert json.loads(by_path)["model"] == KIMI
    assert json.loads(by_path)["blockers"] == report["blockers"]


@pytest.mark.wheel
def test_doctor_on_a_model_not_cached_is_one_usage_line(site_059: Path, cache: Path) -> None:
    code, out, err = doctor(site_059, "--model", KIMI_ID)
    assert code == ExitCode.USAGE and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"sglpatch: error: --model {KIMI_ID}: not in the local Hugging Face")
    assert "Traceback" not in err


@pytest.mark.wheel
def test_a_bare_hub_name_not_cached_says_how_to_pass_it(tree_059: Path, cache: Path) -> None:
    code, out, err = doctor(tree_059, "--model", "GLM-5.3-Flash")
    assert code == ExitCode.USAGE and out == ""
    (line,) = err.strip().splitlines()
    assert "GLM-5.3-Flash looks like a Hugging Face model name" in line
    assert "ORG/NAME" in line and "--model-path DIR" in line
