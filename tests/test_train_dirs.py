"""train-target and train-drafter treat --out as a user's folder: a run creates its directory or is refused
(--force to reuse one that is not ours), deletes only the files it wrote, and runs every check (corpus, splits,
held-out prompts, the directory, a resumed checkpoint) before it touches a file. Each case is a hostile or
careless input made here in tmp_path."""
from __future__ import annotations

import contextlib
import errno
import io
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from cli.__main__ import main
from engine.loaders.dflash_checkpoint import read_dflash_dir
from engine.loaders.hf_import import read_hf_dir

TOKENIZER = Path(__file__).parents[1] / "models" / "ddtree-py-22m" / "tokenizer.json"
QUICK = ["--preset", "tiny", "--device", "cpu", "--tokenizer", str(TOKENIZER), "--steps", "4", "--batch-size", "2",
         "--seq-len", "64", "--log-every", "2", "--eval-every", "2", "--checkpoint-every", "2",
         "--save-dtype", "float32"]


def cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder (relative path -> bytes)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Forty standard-library files: both splits hold enough text for the quick recipe."""
    folder = tmp_path_factory.mktemp("corpus")
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-m]*.py"))[:40]:
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="module")
def target(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("target") / "run"
    code, err = cli("train-target", "--out", str(out), "--corpus-dir", str(corpus), *QUICK)
    assert code == 0, err
    return out


def users_folder(folder: Path) -> dict[str, bytes]:
    """A folder holding a user's model (config.json + model.safetensors, no training.json), notes and a
    subfolder."""
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"mine": true}\n')
    (folder / "model.safetensors").write_bytes(b"the user's weights")
    (folder / "notes.txt").write_text("keep me\n")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return snapshot(folder)


def test_train_target_refuses_a_folder_it_did_not_create(corpus, tmp_path):
    before = users_folder(tmp_path / "model")
    code, err = cli("train-target", "--out", str(tmp_path / "model"), "--corpus-dir", str(corpus), *QUICK)
    assert code == 2 and "no training run wrote" in err and "--force" in err and "notes.txt" in err, err
    assert snapshot(tmp_path / "model") == before


def test_train_target_with_force_leaves_the_other_files_alone(corpus, tmp_path):
    before = users_folder(tmp_path / "model")
    code, err = cli("train-target", "--out", str(tmp_path / "model"), "--corpus-dir", str(corpus), *QUICK, "--force")
    assert code == 0, err
    after = snapshot(tmp_path / "model")
    assert {k: after[k] for k in ("notes.txt", "sub/data.bin")} == {k: before[k] for k in ("notes.txt", "sub/data.bin")}
    assert read_hf_dir(tmp_path / "model").config.vocab_size == 4096  # its config.json and weights replaced
    assert not (tmp_path / "model" / "checkpoints").exists()


def test_a_held_out_split_too_small_fails_before_anything_is_written(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "big.py").write_text("def f(x):\n    return x + 1\n" * 400)
    (folder / "small.py").write_text("x = 1\n")  # the only file hashing lowest: the held-out split
    for argv in ([], ["--resume"]):
        code, err = cli("train-target", "--out", str(tmp_path / "run"), "--corpus-dir", str(folder), *QUICK, *argv)
        assert code == 2, err
        assert not (tmp_path / "run").exists(), "a refused run leaves nothing behind"
    code, err = cli("train-target", "--out", str(tmp_path / "run"), "--corpus-dir", str(folder), *QUICK)
    assert "held-out split has" in err and "--corpus-dir" in err and "--seq-len" in err, err


def test_an_out_under_a_file_or_a_file_fails_clearly(corpus, tmp_path):
    (tmp_path / "file").write_text("x")
    for out, message in ((tmp_path / "file" / "sub", "is a file, so no directory"), (tmp_path / "file", "is a file")):
        code, err = cli("train-target", "--out", str(out), "--corpus-dir", str(corpus), *QUICK)
        assert code == 2 and message in err, err
    assert (tmp_path / "file").read_text() == "x"


def test_an_unreadable_corpus_file_is_named_before_anything_is_written(corpus, tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    shutil.copytree(corpus, folder)
    locked = folder / sorted(p.name for p in folder.iterdir())[5]
    real = Path.read_text

    def read_text(path, *args, **kwargs):
        if path == locked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    code, err = cli("train-target", "--out", str(tmp_path / "run"), "--corpus-dir", str(folder), *QUICK)
    assert code == 2 and str(locked) in err and "Permission denied" in err, err
    assert not (tmp_path / "run").exists()


def test_a_full_disk_names_the_directory(corpus, tmp_path, monkeypatch):
    import cli.train_target as command

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(command, "save_hf_dir", full)
    code, err = cli("train-target", "--out", str(tmp_path / "run"), "--corpus-dir", str(corpus), *QUICK)
    assert code == 2 and f"writing into {tmp_path / 'run'} failed: No space left on device" in err, err


def paused_run(corpus: Path, out: Path) -> Path:
    code, err = cli("train-target", "--out", str(out), "--corpus-dir", str(corpus), *QUICK, "--pause-at", "2")
    assert code == 0, err
    return out / "checkpoints" / "step-0000002.pt"


def test_resume_of_a_foreign_or_tampered_checkpoint_fails_clearly(corpus, tmp_path):
    checkpoint = paused_run(corpus, tmp_path / "run")
    state = torch.load(checkpoint, weights_only=True)
    cases = {
        "foreign": ({"weights": torch.zeros(3)}, "not a checkpoint of this command"),
        "renumbered": ({**state, "step": 3}, "does not match its name"),
        "recipe": ({**state, "recipe": {**state["recipe"], "betas": 5}}, "its recipe is not one of this version"),
        "reshaped": ({**state, "model": {**state["model"], "lm_head.weight": torch.zeros(2, 2)}},
                     "does not fit this run"),
    }
    for name, (content, message) in cases.items():
        torch.save(content, checkpoint)
        before = snapshot(tmp_path / "run")
        code, err = cli("train-target", "--out", str(tmp_path / "run"), "--resume")
        assert code == 2 and message in err and str(checkpoint) in err, (name, err)
        assert snapshot(tmp_path / "run") == before, name
    (tmp_path / "garbage.pt").write_bytes(b"\x00" * 64)
    shutil.copy(tmp_path / "garbage.pt", checkpoint)
    code, err = cli("train-target", "--out", str(tmp_path / "run"), "--resume")
    assert code == 2 and "not a readable training checkpoint" in err


DRAFTER_QUICK = ["--preset", "tiny", "--device", "cpu", "--steps", "4", "--num-sequences", "8", "--log-every", "2",
                 "--eval-every", "2", "--checkpoint-every", "2", "--save-dtype", "float32"]


def test_train_drafter_refuses_a_downloaded_drafter_and_with_force_keeps_what_it_did_not_write(target, corpus,
                                                                                             tmp_path):
    out = tmp_path / "drafter"
    before = users_folder(out)
    argv = ["train-drafter", "--target", str(target), "--out", str(out), "--corpus-dir", str(corpus), *DRAFTER_QUICK]
    code, err = cli(*argv)
    assert code == 2 and "no training run wrote" in err and "--force" in err, err
    assert snapshot(out) == before
    code, err = cli(*argv, "--force")
    assert code == 0, err
    after = snapshot(out)
    assert after["notes.txt"] == before["notes.txt"] and after["sub/data.bin"] == before["sub/data.bin"]
    assert sorted(after) == ["config.json", "model.safetensors", "notes.txt", "sub/data.bin", "training.json"]
    read_dflash_dir(out)
    assert [p.name for p in tmp_path.iterdir()] == ["drafter"], "no staging folder left beside it"


def test_train_drafter_checks_its_prompts_before_writing(target, tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.py").write_text("x = 1\n")
    code, err = cli("train-drafter", "--target", str(target), "--out", str(tmp_path / "d"), "--corpus-dir",
                    str(folder), *DRAFTER_QUICK)
    assert code == 2 and "--num-sequences" in err and "--corpus-dir" in err, err
    assert not (tmp_path / "d").exists()


def test_a_paused_and_resumed_target_run_equals_an_uninterrupted_one(corpus, tmp_path):
    from safetensors.torch import load_file

    common = ["--corpus-dir", str(corpus), *QUICK]
    assert cli("train-target", "--out", str(tmp_path / "whole"), *common)[0] == 0
    paused_run(corpus, tmp_path / "parts")
    code, err = cli("train-target", "--out", str(tmp_path / "parts"), "--resume")
    assert code == 0, err
    whole, parts = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "parts"))
    assert all(torch.equal(whole[k], parts[k]) for k in whole)


def test_a_paused_and_resumed_drafter_run_equals_an_uninterrupted_one(target, corpus, tmp_path):
    from engine.loaders.dflash_checkpoint import load_tensors

    common = ["train-drafter", "--target", str(target), "--corpus-dir", str(corpus), *DRAFTER_QUICK]
    assert cli(*common, "--out", str(tmp_path / "a"))[0] == 0
    assert cli(*common, "--out", str(tmp_path / "b"), "--pause-at", "2")[0] == 0
    assert (tmp_path / "b" / "sequences.pt").is_file()
    code, err = cli(*common, "--out", str(tmp_path / "b"), "--resume")
    assert code == 0, err
    a, b = (load_tensors(read_dflash_dir(tmp_path / n), "cpu", torch.float32) for n in "ab")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["config.json", "model.safetensors", "training.json"]
