"""engine.training.corpus: the standard-library corpus, its stable hash split, directory corpora, held-out prompts."""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from engine.loaders.text import train_bpe
from engine.training.corpus import (
    HELD_OUT_SHARE,
    STDLIB_EXCLUDED_DIRS,
    CorpusError,
    directory_corpus,
    draw_prompts,
    load_corpus,
    split_of,
    stdlib_corpus,
)


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus()


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_bpe(list(corpus.texts("held-out"))[:6], vocab_size=320)


def test_stdlib_corpus_is_the_library_itself(corpus):
    assert corpus.root == Path(sysconfig.get_paths()["stdlib"])
    assert list(corpus.files) == sorted(corpus.files) and len(corpus.files) > 300
    assert all(f.endswith(".py") for f in corpus.files)
    assert not [f for f in corpus.files if STDLIB_EXCLUDED_DIRS & set(f.split("/")[:-1])]
    assert not [f for f in corpus.files if f.split("/")[-1].startswith("_sysconfigdata")]
    assert {"os.py", "json/decoder.py", "asyncio/events.py"} <= set(corpus.files)
    assert corpus.num_bytes() > 5_000_000
    assert load_corpus(None) == corpus  # a second listing is the same


def test_split_is_a_stable_hash_of_the_relative_path(corpus):
    train, held = corpus.split_files("train"), corpus.split_files("held-out")
    assert not set(train) & set(held) and sorted(train + held) == list(corpus.files)
    for f in corpus.files:  # the rule, computed independently
        low = int(hashlib.sha256(f.encode()).hexdigest()[:16], 16) < HELD_OUT_SHARE * 2**64
        assert (f in held) == low == (split_of(f) == "held-out")
    assert 0.01 < len(held) / len(corpus.files) < 0.12
    info = corpus.describe()
    assert info["train"]["files"] + info["held-out"]["files"] == len(corpus.files)
    assert info["train"]["bytes"] + info["held-out"]["bytes"] == corpus.num_bytes()


def test_texts_follow_the_split_order(corpus):
    held = corpus.split_files("held-out")
    texts = list(corpus.texts("held-out"))
    assert texts == [(corpus.root / f).read_text(encoding="utf-8") for f in held]
    with pytest.raises(CorpusError, match="split='test'"):
        corpus.split_files("test")


def test_directory_corpus(tmp_path):
    for name in ("b.py", "a.txt", "sub/c.md", "sub/d.py", "skip.bin", ".hidden/e.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"text of {name}\n")
    corpus = directory_corpus(tmp_path)
    assert corpus.files == ("a.txt", "b.py", "sub/c.md", "sub/d.py")
    held = corpus.split_files("held-out")
    assert len(held) >= 1 and not set(held) & set(corpus.split_files("train"))
    assert load_corpus(tmp_path) == corpus


def test_directory_corpus_errors(tmp_path):
    with pytest.raises(CorpusError, match="not a directory"):
        directory_corpus(tmp_path / "missing")
    (tmp_path / "only.py").write_text("x = 1\n")
    with pytest.raises(CorpusError, match="1 text file"):
        directory_corpus(tmp_path)
    (tmp_path / "latin1.py").write_bytes("caf\xe9\n".encode("latin-1"))
    corpus = directory_corpus(tmp_path)
    with pytest.raises(CorpusError, match="latin1.py: not UTF-8"):
        list(corpus.texts("train")) + list(corpus.texts("held-out"))


def test_prompts_are_deterministic_line_starts_of_held_out_files(corpus, tokenizer):
    prompts = draw_prompts(corpus, tokenizer, num_prompts=24, prompt_len=16, seed=7)
    assert prompts.shape == (24, 16) and prompts.dtype == np.int64
    assert np.array_equal(prompts, draw_prompts(corpus, tokenizer, num_prompts=24, prompt_len=16, seed=7))
    other = draw_prompts(corpus, tokenizer, num_prompts=24, prompt_len=16, seed=8)
    assert not np.array_equal(prompts, other)
    held = ["\n" + text for text in corpus.texts("held-out")]
    for prompt in prompts:
        text = tokenizer.decode(prompt.tolist())
        assert text.strip() and any("\n" + text in t for t in held), text
    assert len({tuple(p) for p in prompts.tolist()}) == 24


def test_prompts_beyond_the_split_are_refused(tmp_path, tokenizer):
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x = 1\ny = 2\n")
    small = directory_corpus(tmp_path)
    with pytest.raises(CorpusError, match="only 0 line starts followed by 64 tokens"):
        draw_prompts(small, tokenizer, num_prompts=2, prompt_len=64, seed=0)
    with pytest.raises(CorpusError, match="must be >= 1"):
        draw_prompts(small, tokenizer, num_prompts=0, prompt_len=4, seed=0)
