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


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_an_oversized_or_unreadable_json_file_is_named(model_dir, tmp_path, monkeypatch, name):
    """The config (Hugging Face loader) and the tokenizer (tokenizer loader) read through one bounded reader: a file
    past the size limit, and one that cannot be read, are each refused with the file's path and what was wrong."""
    import engine.loaders.hf_layout as hf_layout
    import engine.loaders.tokenizer_file as tokenizer_file
    root = copy_of(model_dir, tmp_path)
    size = (root / name).stat().st_size
    for module in (hf_layout, tokenizer_file):
        monkeypatch.setattr(module, "MAX_JSON_BYTES", size - 1)
    with pytest.raises(ValueError, match=f"is larger than {size - 1} bytes, too large for a") as err:
        load_model(root)
    assert str(root / name) in str(err.value)
    monkeypatch.undo()
    real_open = open

    def failing_open(path, *args, **kwargs):  # a read error of the disk (as root, permissions do not stop a read)
        if Path(path).name == name:
            raise OSError(5, "Input/output error")
        return real_open(path, *args, **kwargs)

    from engine.loaders import strict_json
    monkeypatch.setattr(strict_json, "open", failing_open, raising=False)
    with pytest.raises(ValueError, match=r"cannot be read \(Input/output error\)") as err:
        load_model(root)
    assert str(root / name) in str(err.value)


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


def test_ids_past_a_smaller_tokenizer_show_as_markers_and_the_run_completes(model_dir, tmp_path, capsys):
    from cli.__main__ import main

    ckpt = load_model(model_dir)
    tokenizer = ckpt.tokenizer
    assert tokenizer.vocab_size < ckpt.config.vocab_size
    past = ckpt.config.vocab_size - 1
    assert tokenizer.decode([tokenizer.encode("def")[0], past]) == f"def<id {past}>"
    assert tokenizer.piece(past) == f"<id {past}>" and tokenizer.token_bytes(past) == b""
    code = main(["run", "--model", str(model_dir), "--prompt", f"{past},{past - 1}", "--max-new", "4", "--report",
                 str(tmp_path / "reports")])
    assert code in (0, 1), capsys.readouterr().err  # 1: a divergence verdict, not a crash
    assert (tmp_path / "reports" / "report.json").is_file()


@pytest.fixture(scope="module")
def model(model_dir):
    from engine.model.target import TargetModel

    return TargetModel.from_checkpoint(load_model(model_dir))


def test_decoder_misuse_is_a_clear_error(model):
    import torch

    from engine.config import DecodeConfig
    from engine.decoding.decoder import ARDecoder, DecodeError

    cfg = DecodeConfig(max_new_tokens=2, budget=0)
    cases = [((model, None, cfg), "prompt is NoneType"), ((model, torch.tensor([1, 2]), cfg), "prompt is a Tensor"),
             ((model, "1 2", cfg), "prompt is str"), ((model, [1, 2], None), "cfg is a NoneType"),
             ((None, [1, 2], cfg), "model is a NoneType")]
    for args, message in cases:
        with pytest.raises(DecodeError, match=message):
            ARDecoder(*args)


def test_a_drafter_proposing_a_tensor_that_requires_grad_is_named(model):
    import torch

    from engine.decoding.decoder import DecodeError, check_draft

    draft = torch.zeros(3, model.cfg.vocab_size, requires_grad=True)
    with pytest.raises(DecodeError, match="requires grad"):
        check_draft(draft, 3, model, "mine", 0)


def test_from_checkpoint_misuse_is_a_clear_error(model_dir):
    import torch

    from engine.model.target import TargetModel

    ckpt = load_model(model_dir)
    with pytest.raises(ValueError, match="dtype='float16'"):
        TargetModel.from_checkpoint(ckpt, dtype="float16")
    with pytest.raises(ValueError, match="device='tpu'"):
        TargetModel.from_checkpoint(ckpt, "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            TargetModel.from_checkpoint(ckpt, "cuda")


def test_prompt_text_that_is_not_utf8_is_a_clear_error(model_dir, capsys):
    from cli.__main__ import main

    text = b"def caf\xe9(".decode("utf-8", "surrogateescape")  # what argv holds for bytes that are not UTF-8
    assert main(["run", "--model", str(model_dir), "--prompt-text", text, "--max-new", "2"]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err
