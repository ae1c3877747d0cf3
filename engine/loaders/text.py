"""Text <-> token ids: a byte-level BPE tokenizer (Hugging Face `tokenizers`), stored as tokenizer.json.

Byte-level means every string round-trips: the pre-tokenizer maps each UTF-8 byte to one printable character
(GPT-2's table) before BPE, so no input is unknown and decode(encode(text)) == text. `piece(id)` turns a
token back into the bytes it stands for and renders them for display, whitespace and stray bytes made visible.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.loaders.tokenizer_file import TOKENIZER_FILE, TokenizerError, read_tokenizer_json

__all__ = ["END_OF_TEXT", "TOKENIZER_FILE", "Tokenizer", "TokenizerError", "render_bytes", "train_bpe"]
END_OF_TEXT = "<|endoftext|>"  # separates documents in the training stream; id 0 in a tokenizer train_bpe made
VISIBLE_WHITESPACE = {" ": "·", "\n": "↵", "\t": "→"}
ROUND_TRIP_PROBE = "def f(x):\n\treturn x  # ünïcödé ✓ 𝄞\r\n"  # spaces, tabs, CR, 2-, 3- and 4-byte characters


@contextlib.contextmanager
def _rust_errors(source: str) -> Iterator[None]:
    """The Rust tokenizer's panic (pyo3's PanicException, a BaseException) as a TokenizerError naming the file."""
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise TokenizerError(f"{source}: the tokenizer library failed on this file ({exc}); re-create it with "
                             "train_bpe or copy an intact one") from None


def _valid_text(text: str) -> str:
    """text, refused with a clear message if it holds a lone surrogate: bytes that were not UTF-8 (Python keeps
    them so in command-line arguments)."""
    if not isinstance(text, str):
        raise TokenizerError(f"the text to encode is a {type(text).__name__}, expected a str")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"the text to encode is not valid UTF-8 (character {exc.start}: a byte that is not "
                             "UTF-8, e.g. in --prompt-text); pass UTF-8 text") from None
    return text


@cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode, the table ByteLevel uses: printable bytes map to themselves,
    the other 68 to U+0100 onwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    return {c: b for b, c in chars.items()}


def render_bytes(data: bytes) -> str:
    """Bytes as display text: valid UTF-8 characters as themselves, space/newline/tab as visible marks, any other
    unprintable character and any byte that is not valid UTF-8 on its own as <0xNN> per byte."""
    out, i = [], 0
    while i < len(data):
        for width in (1, 2, 3, 4):  # the shortest slice that decodes is the character starting at i
            try:
                ch = data[i:i + width].decode("utf-8")
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{data[i]:02X}>")
            i += 1
            continue
        if ch in VISIBLE_WHITESPACE:
            out.append(VISIBLE_WHITESPACE[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.extend(f"<0x{b:02X}>" for b in data[i:i + width])
        i += width
    return "".join(out)


class Tokenizer:
    """A byte-level BPE tokenizer: encode, decode, per-token display pieces, save."""

    def __init__(self, hf: HFTokenizer, source: str) -> None:
        self._hf = hf
        self.source = source
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        self.model_vocab_size = self.vocab_size  # ids in [vocab_size, model_vocab_size) show as <id N> (fit_model)
        self._special = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """From a tokenizer.json file or a model directory holding one (engine.loaders.tokenizer_file checks the
        file); then the vocabulary must be ids 0..V-1 with no hole, and a probe text must round-trip."""
        file, data = read_tokenizer_json(path)
        try:
            with _rust_errors(str(file)):
                hf = HFTokenizer.from_str(json.dumps(data))
        except TokenizerError:
            raise
        except Exception as exc:  # tokenizers raises a plain Exception for a malformed file
            raise TokenizerError(f"{file}: not a valid tokenizer.json ({exc}); re-create it with train_bpe or copy "
                                 "an intact one") from exc
        with _rust_errors(str(file)):
            ids = sorted(hf.get_vocab(with_added_tokens=True).values())
        if not ids:
            raise TokenizerError(f"{file}: field 'model.vocab' is empty: the tokenizer has no token at all")
        if ids != list(range(len(ids))):
            hole = next(i for i, found in enumerate(ids) if found != i)
            raise TokenizerError(f"{file}: its vocabulary has a hole at id {hole} (ids must be 0..{len(ids) - 1} "
                                 "with none missing or repeated); re-create it with train_bpe")
        tokenizer = cls(hf, str(file))
        if tokenizer.decode(tokenizer.encode(ROUND_TRIP_PROBE)) != ROUND_TRIP_PROBE:
            raise TokenizerError(f"{file}: text does not round-trip through it (decode(encode(text)) != text); "
                                 "expected a byte-level BPE tokenizer such as train_bpe makes")
        return tokenizer

    @property
    def end_of_text_id(self) -> int | None:
        """The id of END_OF_TEXT, or None if this vocabulary has no such token."""
        return self._hf.token_to_id(END_OF_TEXT)

    def encode(self, text: str) -> list[int]:
        with _rust_errors(self.source):
            return self._hf.encode(_valid_text(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """encode() of each text, computed in parallel."""
        texts = [_valid_text(t) for t in texts]
        with _rust_errors(self.source):
            return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def fit_model(self, model_vocab_size: int) -> None:
        """A model whose vocabulary is larger (padded past the tokenizer, as many checkpoints are): the ids it may
        produce past the tokenizer decode and display as <id N> instead of failing after a whole decode."""
        self.model_vocab_size = max(model_vocab_size, self.vocab_size)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [self._checked(i) for i in ids]
        runs, out = [], []
        for i in [*ids, None]:  # runs of known ids decoded together, <id N> between them
            if i is not None and i < self.vocab_size:
                runs.append(i)
                continue
            if runs:
                with _rust_errors(self.source):
                    out.append(self._hf.decode(runs, skip_special_tokens=False))
                runs = []
            if i is not None:
                out.append(f"<id {i}>")
        return "".join(out)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a special token: its text in UTF-8; an id past the tokenizer: none)."""
        if self._checked(token_id) >= self.vocab_size:
            return b""
        token = self._hf.id_to_token(token_id)
        if token in self._special:
            return token.encode("utf-8")
        table = _unicode_to_byte()
        return bytes(table[c] for c in token)

    def piece(self, token_id: int) -> str:
        """The token's text for display: "·" a space, "↵" a newline, "→" a tab, "<0xNN>" a byte that is not
        valid UTF-8 on its own (part of a longer character) or an unprintable character; special tokens as-is;
        an id past the tokenizer (fit_model) "<id N>"."""
        if self._checked(token_id) >= self.vocab_size:
            return f"<id {token_id}>"
        token = self._hf.id_to_token(token_id)
        return token if token in self._special else render_bytes(self.token_bytes(token_id))

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json into directory (created if needed); returns the file."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = directory / TOKENIZER_FILE
        self._hf.save(str(file))
        return file

    def _checked(self, token_id: int) -> int:
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < self.model_vocab_size:
            raise TokenizerError(f"token id {token_id!r} is outside the vocabulary [0, {self.model_vocab_size}) of "
                                 f"{self.source}")
        return token_id


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
              special_tokens: Sequence[str] = (END_OF_TEXT,)) -> Tokenizer:
    """Train a byte-level BPE tokenizer on texts (deterministic: the same texts give the same tokenizer).

    The vocabulary holds special_tokens first (ids 0, 1, ...), then the 256 byte symbols, then the merges."""
    min_vocab = len(special_tokens) + 256
    if not isinstance(vocab_size, int) or vocab_size < min_vocab:
        raise TokenizerError(f"vocab_size={vocab_size!r}: a byte-level BPE needs at least {min_vocab} "
                             f"(256 byte symbols + {len(special_tokens)} special tokens)")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(hf, f"train_bpe(vocab_size={vocab_size})")
