"""Token streams and the batches cut from them, on the training device with no host round trips per step.

A split's stream is its files' tokens, each file followed by END_OF_TEXT, in corpus order. Training windows
of seq_len + 1 tokens are visited an epoch at a time: each epoch cuts the stream at an offset and visits the
windows in an order, both drawn from (seed, epoch). So the batch of any step is a function of (seed, step)
alone: a resumed run reads exactly the batches an uninterrupted one would.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.loaders.text import END_OF_TEXT, Tokenizer
from engine.training.corpus import Corpus
from engine.training.recipe import TrainError


def token_stream(corpus: Corpus, tokenizer: Tokenizer, split: str) -> torch.Tensor:
    """[num_tokens] int64 on the CPU: every file of split, each followed by END_OF_TEXT."""
    eot = tokenizer.end_of_text_id
    if eot is None:
        raise TrainError(f"{tokenizer.source} has no {END_OF_TEXT} token to separate files; use a tokenizer "
                         "made by train_bpe (or leave out --tokenizer)")
    ids = [np.asarray([*doc, eot], dtype=np.int64) for doc in tokenizer.encode_batch(list(corpus.texts(split)))]
    return torch.from_numpy(np.concatenate(ids))


class WindowSampler:
    """Batches [batch_size, seq_len + 1] of a stream, epoch by epoch (see the module docstring)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int) -> None:
        self.num_windows = (stream.numel() - seq_len) // seq_len  # fits at any offset in [0, seq_len)
        if self.num_windows < 1:
            raise TrainError(f"the train split has {stream.numel()} tokens, fewer than two windows of "
                             f"seq_len={seq_len}; use a --corpus-dir with more text or a shorter --seq-len")
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed
        self.span = torch.arange(seq_len + 1, device=stream.device)
        self._starts: dict[int, torch.Tensor] = {}

    def epoch_starts(self, epoch: int) -> torch.Tensor:
        """The window starts of an epoch in visiting order [num_windows] (the last two epochs are kept)."""
        if epoch not in self._starts:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len))
            order = rng.permutation(self.num_windows)
            self._starts = {e: s for e, s in self._starts.items() if e == epoch - 1}
            starts = torch.from_numpy(offset + order * self.seq_len)
            if self.stream.is_cuda:  # a pinned buffer copies without making the host wait for the device
                starts = starts.pin_memory()
            self._starts[epoch] = starts.to(self.stream.device, non_blocking=True)
        return self._starts[epoch]

    def batch(self, step: int) -> torch.Tensor:
        first, parts = step * self.batch_size, []
        while sum(p.numel() for p in parts) < self.batch_size:
            epoch, index = divmod(first, self.num_windows)
            take = min(self.num_windows - index, self.batch_size - sum(p.numel() for p in parts))
            parts.append(self.epoch_starts(epoch)[index:index + take])
            first += take
        starts = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.stream[starts[:, None] + self.span]

    def epochs_at(self, step: int) -> float:
        """Passes over the train stream after `step` steps."""
        return step * self.batch_size / self.num_windows


def eval_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Up to max_windows windows [n, seq_len + 1] spread evenly over a held-out stream, the same every time."""
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    if n < 1:
        raise TrainError(f"the held-out split has {stream.numel()} tokens, fewer than one window of "
                         f"seq_len={seq_len}; use a --corpus-dir with more text or a shorter --seq-len")
    starts = torch.linspace(0, stream.numel() - 1 - seq_len, n).round().long()
    return stream[starts[:, None] + torch.arange(seq_len + 1)]
