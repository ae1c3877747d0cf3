"""Hostile model directories and API misuse, made here in tmp_path: every one a clear error naming the file,
field or argument, before any work is done."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hf_dirs import write_hf_dir

from engine.loaders.hf_config import HFLoadError
from engine.loaders.loading import ModelLoadError, load_model
from engine.loaders.text import train_bpe
from engine.model.fixtures import random_weights, tiny_config


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Hugging Face directory with a tokenizer (vocabulary within the config's) and a prompts.json."""
    root = tmp_path_factory.mktemp("hf") / "model"
    cfg = tiny_config()
    write_hf_dir(root, cfg, random_weights(cfg, 0))
    train_bpe(["def f(x):\n    return x\n" * 20], vocab_size=min(cfg.vocab_size, 300)).save(root)
    (root / "prompts.json").write_text(json.dumps({"prompts": [{"text": "def f("}]}))
    return root


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    root = tmp_path / "model"
    shutil.copytree(model_dir, root)
    return root


def test_the_directory_loads_with_its_prompts(model_dir):
    assert load_model(model_dir).prompt_texts == ("def f(",)


@pytest.mark.parametrize(("content", "message"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"prompts": [{"text": "a"}], "prompts": []}', "duplicate key"),
    ('{"prompts": [{"text": 3}]}', "field 'prompts'"),
    ('{"prompts": []}', "field 'prompts'"),
])
def test_hostile_prompts_files_are_refused(model_dir, tmp_path, content, message):
    root = copy_of(model_dir, tmp_path)
    (root / "prompts.json").write_text(content)
    with pytest.raises((HFLoadError, ModelLoadError), match=message) as err:
        load_model(root)
    assert str(root / "prompts.json") in str(err.value)


@pytest.mark.parametrize("target", ["outside", "/dev/zero"])
def test_prompts_and_tokenizer_links_out_of_the_directory_are_refused(model_dir, tmp_path, target):
    root = copy_of(model_dir, tmp_path)
    outside = tmp_path / "outside.json"
    shutil.copy(root / "prompts.json", outside)
    for name in ("prompts.json", "tokenizer.json"):
        linked = copy_of(root, tmp_path / name)
        if target == "outside":
            shutil.copy(linked / name, outside)
        (linked / name).unlink()
        (linked / name).symlink_to(outside if target == "outside" else target)
        with pytest.raises(ValueError, match="outside the model directory"):
            load_model(linked)
