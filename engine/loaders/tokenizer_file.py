"""tokenizer.json as the loaders read it: the same checks as every other file of a model directory.

In a model directory the file must resolve inside it (engine.loaders.hf_layout.resolve_inside: a symlink out of
it, or to /dev/zero, is refused); a file given directly must be a regular file. It is read with a size bound
and parsed strictly (engine.loaders.strict_json). Then the fields that would change a prompt silently are
refused by name: truncation and padding (they cut or pad every prompt), a normalizer (it rewrites the text),
and a missing byte-level pre-tokenizer (without it text is not split into bytes and does not round-trip).
"""
from __future__ import annotations

from pathlib import Path

from engine.loaders import strict_json
from engine.loaders.hf_config import HFLoadError
from engine.loaders.hf_layout import MAX_JSON_BYTES, resolve_inside

TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(ValueError):
    """A tokenizer file is missing or unusable, or a token id is outside the vocabulary."""


def _locate(path: Path) -> Path:
    """The tokenizer.json of a model directory (checked to lie inside it) or a file given directly."""
    if path.is_dir():
        try:
            return resolve_inside(path, TOKENIZER_FILE, "the tokenizer file")
        except HFLoadError as exc:
            raise TokenizerError(f"{exc}".replace("re-download the checkpoint", "pass a tokenizer.json")) from exc
    if not path.exists():
        raise TokenizerError(f"{path}: no such file; pass a tokenizer.json or a model directory holding one")
    if not path.is_file():
        raise TokenizerError(f"{path}: not a regular file; pass a tokenizer.json or a model directory holding one")
    return path


def _uses_byte_level(pre_tokenizer: object) -> bool:
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_uses_byte_level(p) for p in pre_tokenizer.get("pretokenizers") or [])
    return pre_tokenizer.get("type") == "ByteLevel"


def read_tokenizer_json(path: str | Path) -> tuple[Path, dict]:
    """(the file, its parsed content) of a tokenizer.json or a model directory holding one, checked as the module
    docstring says; every problem is a TokenizerError naming the file and the field."""
    file = _locate(Path(path))
    try:
        data = strict_json.read_file(file, MAX_JSON_BYTES, "a tokenizer.json")
    except strict_json.StrictJSONError as exc:
        raise TokenizerError(f"{file} {exc}; re-create it with train_bpe or copy an intact one") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{file}: expected a JSON object, found {type(data).__name__}")
    model, decoder = data.get("model"), data.get("decoder")
    model_type = model.get("type") if isinstance(model, dict) else None
    decoder_type = decoder.get("type") if isinstance(decoder, dict) else None
    if model_type != "BPE" or decoder_type != "ByteLevel":
        raise TokenizerError(f"{file}: model {model_type!r} with decoder {decoder_type!r}; expected a byte-level "
                             "BPE tokenizer (model BPE, decoder ByteLevel)")
    for field, effect in (("truncation", "cuts every prompt"), ("padding", "pads every prompt"),
                          ("normalizer", "rewrites the prompt's text before it is encoded")):
        if data.get(field) is not None:
            raise TokenizerError(f"{file}: field {field!r} is set, which {effect}; set it to null")
    if not _uses_byte_level(data.get("pre_tokenizer")):
        raise TokenizerError(f"{file}: field 'pre_tokenizer' is {data.get('pre_tokenizer')!r:.80}; expected a "
                             "ByteLevel pre-tokenizer (alone or in a Sequence), without which text does not "
                             "round-trip")
    return file, data
