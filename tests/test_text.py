"""engine.loaders.text: the byte-level BPE tokenizer round-trips any text, renders pieces visibly, trains
deterministically, and refuses bad files and ids with errors that name them."""
from __future__ import annotations

import json
import pathlib
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.loaders.text import END_OF_TEXT, TOKENIZER_FILE, Tokenizer, TokenizerError, train_bpe

ODD_TEXT = "def f(x):\n\treturn x  # ok\r\n\u00a0naïve 漢字 e\u0301 😀\u2028\u200b\x00\x7f שלום\ufeff"
ALPHABET = st.sampled_from(list(" \t\n\r\x0b\x0c\u00a0\u2028\u2029\u200b\ufeff\x00\x7f") + list("abcXYZ019_(){}:#'\"")
                           + ["é", "e\u0301", "漢", "😀", "ש", "\U0010fffd"]) | st.characters(exclude_categories=["Cs"])


def stdlib_sample() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8") for p in sorted(root.glob("[a-c]*.py"))[:12]]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_bpe(stdlib_sample(), vocab_size=400)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(ALPHABET, max_size=120).map("".join))
def test_round_trip_of_random_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_batch_encoding_equals_one_by_one(tokenizer):
    texts = [ODD_TEXT, "", "import os\n", ODD_TEXT[::-1]]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]


def test_pieces_make_whitespace_and_stray_bytes_visible(tokenizer):
    text = "def f(x):\n\treturn x  # ok"
    visible = text.replace(" ", "·").replace("\n", "↵").replace("\t", "→")
    assert "".join(tokenizer.piece(i) for i in tokenizer.encode(text)) == visible
    # U+1F600 is unseen in the training text: four byte tokens, none valid UTF-8 on its own
    assert [tokenizer.piece(i) for i in tokenizer.encode("😀")] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert "".join(tokenizer.piece(i) for i in tokenizer.encode("\r\x00")) == "<0x0D><0x00>"
    assert "".join(tokenizer.piece(i) for i in tokenizer.encode("\u00a0")) == "<0xC2><0xA0>"  # unprintable
    assert tokenizer.piece(tokenizer.end_of_text_id) == END_OF_TEXT


def test_special_token_and_vocabulary_layout(tokenizer):
    assert tokenizer.vocab_size == 400
    assert tokenizer.end_of_text_id == 0
    assert tokenizer.encode(f"a{END_OF_TEXT}b")[1] == 0
    assert sorted(tokenizer.token_bytes(i) for i in range(1, 257)) == [bytes([b]) for b in range(256)]


def test_training_is_deterministic(tmp_path):
    texts = stdlib_sample()
    first, second = (train_bpe(texts, vocab_size=350).save(tmp_path / name) for name in ("a", "b"))
    assert first.read_bytes() == second.read_bytes()
    other = train_bpe(texts[::-1][:4], vocab_size=350).save(tmp_path / "c")
    assert other.read_bytes() != first.read_bytes()


def test_save_and_load(tokenizer, tmp_path):
    file = tokenizer.save(tmp_path / "model")
    assert file == tmp_path / "model" / TOKENIZER_FILE
    for source in (tmp_path / "model", file):
        loaded = Tokenizer.load(source)
        assert loaded.vocab_size == tokenizer.vocab_size
        assert loaded.encode(ODD_TEXT) == tokenizer.encode(ODD_TEXT)


def test_ids_outside_the_vocabulary_are_refused(tokenizer):
    for bad in (tokenizer.vocab_size, -1, 2**40):
        with pytest.raises(TokenizerError, match=rf"token id {bad} is outside the vocabulary \[0, 400\)"):
            tokenizer.decode([1, bad])
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            tokenizer.piece(bad)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.decode([1.0])


def test_bad_files_are_refused_naming_them(tokenizer, tmp_path):
    with pytest.raises(TokenizerError, match="no such file") as err:
        Tokenizer.load(tmp_path / "missing")
    assert str(tmp_path / "missing") in str(err.value)
    good = json.loads(tokenizer.save(tmp_path / "good").read_text())
    cases = {
        "truncated": (tokenizer.save(tmp_path / "t").read_text()[:500], "not valid JSON"),
        "binary": ("\udcff", "not UTF-8 text"),
        "wordpiece": (json.dumps({**good, "model": {**good["model"], "type": "WordPiece"}}), "byte-level BPE"),
        "no_decoder": (json.dumps({**good, "decoder": None}), "byte-level BPE"),
        "broken_model": (json.dumps({**good, "model": {"type": "BPE", "vocab": 3}}), "not a valid tokenizer.json"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
        with pytest.raises(TokenizerError, match=message) as err:
            Tokenizer.load(path)
        assert str(path) in str(err.value), name
    assert issubclass(TokenizerError, ValueError)


def hostile_tokenizers(good: dict) -> dict[str, tuple[str, str]]:
    """name -> (tokenizer.json content, what the refusal must say)."""
    vocab = good["model"]["vocab"]
    holed = {t: (i if i < 300 else i + 1) for t, i in vocab.items()}
    return {
        "truncation": (json.dumps({**good, "truncation": {"direction": "Right", "max_length": 4, "strategy":
                                                          "LongestFirst", "stride": 8}}), "'truncation' is set"),
        "padding": (json.dumps({**good, "padding": {"strategy": "BatchLongest", "direction": "Right", "pad_id": 0,
                                                    "pad_type_id": 0, "pad_token": "<|endoftext|>",
                                                    "pad_to_multiple_of": None}}), "'padding' is set"),
        "normalizer": (json.dumps({**good, "normalizer": {"type": "Lowercase"}}), "'normalizer' is set"),
        "no_pre_tokenizer": (json.dumps({**good, "pre_tokenizer": None}), "'pre_tokenizer' is None"),
        "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        "duplicate_keys": ('{"model": 1, "model": 2}', "duplicate key"),
        "hole": (json.dumps({**good, "model": {**good["model"], "vocab": holed}}), "hole at id 300"),
        "empty": (json.dumps({**good, "added_tokens": [], "model": {**good["model"], "vocab": {}, "merges": []}}),
                  "'model.vocab' is empty"),
    }


def test_hostile_tokenizer_files_are_refused_naming_the_field(tokenizer, tmp_path):
    good = json.loads(tokenizer.save(tmp_path / "good").read_text())
    for name, (content, message) in hostile_tokenizers(good).items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_text(content)
        with pytest.raises(TokenizerError, match=message) as err:
            Tokenizer.load(folder)
        assert str(folder / "tokenizer.json") in str(err.value), name


def test_tokenizer_links_out_of_the_model_directory_are_refused(tokenizer, tmp_path):
    outside = tokenizer.save(tmp_path / "elsewhere")
    for name, target in (("outside", outside), ("zero", pathlib.Path("/dev/zero"))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").symlink_to(target)
        with pytest.raises(TokenizerError, match="outside the model directory"):
            Tokenizer.load(folder)
    with pytest.raises(TokenizerError, match="not a regular file"):
        Tokenizer.load("/dev/zero")


def test_a_rust_panic_becomes_a_tokenizer_error(tokenizer):
    from tokenizers import Tokenizer as HFTokenizer

    from engine.loaders.text import _rust_errors

    data = json.loads(tokenizer._hf.to_str())
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 8}
    hf = HFTokenizer.from_str(json.dumps(data))  # stride >= max_length: the library panics on encode
    with pytest.raises(TokenizerError, match="the tokenizer library failed"):
        with _rust_errors("tokenizer.json"):
            hf.encode("a b c d e f g h")


def test_text_that_is_not_utf8_is_a_clear_error(tokenizer):
    with pytest.raises(TokenizerError, match="not valid UTF-8"):
        tokenizer.encode(b"caf\xe9".decode("utf-8", "surrogateescape"))  # as argv holds invalid UTF-8
    with pytest.raises(TokenizerError, match="expected a str"):
        tokenizer.encode_batch([b"bytes"])


def test_vocabulary_too_small_is_refused():
    with pytest.raises(TokenizerError, match="at least 257"):
        train_bpe(["abc"], vocab_size=100)
