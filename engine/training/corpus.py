"""The training corpus: text every machine has offline, split into train and held-out by a stable hash.

The default is the Python standard library's own .py sources, shipped with every interpreter (the `stdlib`
path of sysconfig), leaving out what is not the library itself or not on every machine:
- site-packages / dist-packages: third-party code, different on every machine;
- any test/, tests/ or idle_test/ folder: the official Docker images and Debian strip them (Debian ships them
  as a separate package), 3.12 moved several packages' tests into test/, and some are deliberately malformed
  or in legacy encodings;
- idlelib/: the IDLE application, a separate package on Debian and Ubuntu;
- machine-generated files: encodings/ (codec tables written by gencodec.py: 256-entry hex tables that would be
  a seventh of the corpus), pydoc_data/ (the docs' topics dumped into one dict), _sysconfigdata_*.py and the
  config-*/ folder (the build machine's settings).

A file is held out iff the SHA-256 of its path relative to the corpus root (POSIX form) falls in the lowest
HELD_OUT_SHARE of the hash range, so the split of a file is the same on every machine and Python version that
has it. Files are listed in sorted relative-path order.
"""
from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.loaders.text import Tokenizer

HELD_OUT_SHARE = 0.05
SPLITS = ("train", "held-out")
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib",
                                  "encodings", "pydoc_data", "__pycache__"})
DIRECTORY_SUFFIXES = (".py", ".txt", ".md")
_PROMPT_CHARS_PER_TOKEN = 32  # a prompt's text is cut this many characters per token: ample for any BPE token


class CorpusError(ValueError):
    """The corpus cannot be read or split as asked; the message names the file or folder."""


def split_of(relative_path: str) -> str:
    """'held-out' or 'train' for a file, from the hash of its relative POSIX path alone."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return "held-out" if int.from_bytes(digest[:8], "big") < HELD_OUT_SHARE * 2**64 else "train"


@dataclass(frozen=True, slots=True)
class Corpus:
    name: str
    root: Path
    files: tuple[str, ...]  # relative POSIX paths, sorted

    def split_files(self, split: str) -> list[str]:
        """The files of a split, in corpus order. If no file hashes into held-out (a small folder), the file
        with the lowest hash is held out, so both splits are non-empty."""
        if split not in SPLITS:
            raise CorpusError(f"split={split!r}: expected one of {SPLITS}")
        held = [f for f in self.files if split_of(f) == "held-out"]
        if not held:
            held = [min(self.files, key=lambda f: hashlib.sha256(f.encode("utf-8")).digest())]
        chosen = set(held) if split == "held-out" else set(self.files) - set(held)
        return [f for f in self.files if f in chosen]

    def texts(self, split: str) -> Iterator[str]:
        """The text of each file of a split, in corpus order."""
        for rel in self.split_files(split):
            path = self.root / rel
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}: not UTF-8 text ({exc}); convert it or remove it from the corpus") from exc
            except OSError as exc:
                raise CorpusError(f"{path}: cannot be read ({exc.strerror}); fix its permissions or remove it from "
                                  "the corpus") from exc

    def num_bytes(self) -> int:
        return sum((self.root / f).stat().st_size for f in self.files)

    def describe(self) -> dict:
        """Name, root, file and byte counts per split: what training.json records about the corpus."""
        out = {"name": self.name, "root": str(self.root), "held_out_share": HELD_OUT_SHARE}
        for split in SPLITS:
            files = self.split_files(split)
            out[split] = {"files": len(files), "bytes": sum((self.root / f).stat().st_size for f in files)}
        return out


def _listed(root: Path, paths: list[Path], name: str) -> Corpus:
    files = tuple(sorted(p.relative_to(root).as_posix() for p in paths if p.is_file()))
    if len(files) < 2:
        raise CorpusError(f"{root}: {len(files)} text file(s) found; a corpus needs at least 2 (train and held-out)")
    return Corpus(name=name, root=root, files=files)


def stdlib_corpus() -> Corpus:
    """The standard library's .py sources of the running interpreter (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])

    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        return not (STDLIB_EXCLUDED_DIRS & set(parts[:-1]) or parts[-1].startswith("_sysconfigdata")
                    or parts[0].startswith("config-"))

    return _listed(root, [p for p in root.rglob("*.py") if kept(p)], "python-stdlib")


def directory_corpus(path: str | Path) -> Corpus:
    """Every *.py, *.txt and *.md file under path (recursively; hidden folders skipped)."""
    root = Path(path)
    if not root.is_dir():
        raise CorpusError(f"{root}: not a directory; pass a folder of .py/.txt/.md files as the corpus")
    paths = [p for p in root.rglob("*") if p.suffix in DIRECTORY_SUFFIXES
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return _listed(root, paths, f"directory:{root.name}")


def load_corpus(directory: str | Path | None = None) -> Corpus:
    """The corpus in directory, or the standard library's when directory is None."""
    return stdlib_corpus() if directory is None else directory_corpus(directory)


def _line_starts(text: str) -> list[int]:
    """Character offsets of the non-blank lines of text."""
    starts, offset = [], 0
    for line in text.splitlines(keepends=True):
        if line.strip():
            starts.append(offset)
        offset += len(line)
    return starts


def draw_prompts(corpus: Corpus, tokenizer: Tokenizer, num_prompts: int, prompt_len: int, seed: int,
                 split: str = "held-out", advice: str = "use a --corpus-dir with more text") -> np.ndarray:
    """num_prompts prompts of exactly prompt_len tokens [num_prompts, prompt_len] int64, each the start of a
    non-blank line of a file of split, drawn without repetition in an order fixed by seed (the same seed,
    corpus and tokenizer give the same prompts). advice: what the error says to do when there are too few."""
    if num_prompts < 1 or prompt_len < 1:
        raise CorpusError(f"num_prompts={num_prompts}, prompt_len={prompt_len}: both must be >= 1")
    texts = list(corpus.texts(split))
    candidates = [(f, s) for f, text in enumerate(texts) for s in _line_starts(text)]
    order = np.random.default_rng(seed).permutation(len(candidates))
    prompts: list[list[int]] = []
    chunk = 2 * num_prompts
    for begin in range(0, len(order), chunk):
        picks = [candidates[i] for i in order[begin:begin + chunk]]
        cuts = [texts[f][s:s + prompt_len * _PROMPT_CHARS_PER_TOKEN] for f, s in picks]
        prompts.extend(ids[:prompt_len] for ids in tokenizer.encode_batch(cuts) if len(ids) >= prompt_len)
        if len(prompts) >= num_prompts:
            return np.asarray(prompts[:num_prompts], dtype=np.int64)
    raise CorpusError(f"the {split} split of {corpus.name} has only {len(prompts)} line starts followed by "
                      f"{prompt_len} tokens, {num_prompts} needed; {advice}")
