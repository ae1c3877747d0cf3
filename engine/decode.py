"""AR and DDTree decoders: step() -> StepRecord, run() -> RunRecord.

A step works on device tensors only (draft, tree_build, verify, tree_accept, kv_compact, commit) and
never reads them on the host, so on CUDA it needs no synchronisation and can be graph-captured. The
record of the step is read afterwards, off the hot path.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kernels import ops
from profiling.timers import StepTimer

from .cache import LatentCache
from .config import DecodeConfig
from .drafters import Drafter
from .model import TargetModel
from .records import RunRecord, StepRecord, TreeRecord


class DecodeError(ValueError):
    """A decode cannot start or go on: bad prompt, no room in the cache, non-finite logits."""


@dataclass(slots=True)
class _StepTensors:
    """One step's device results, read into a StepRecord after the step."""

    prefix_len: torch.Tensor
    tree: tuple[torch.Tensor, ...]  # tokens, parents, depths, ranks, scores, visibility
    logits: torch.Tensor  # [N, V] float32
    target: torch.Tensor  # [N]
    path: torch.Tensor  # [L + 1], -1 padded
    path_len: torch.Tensor
    bonus: torch.Tensor
    draft: torch.Tensor | None  # [L, V] draft log-probs (DDTree only)


class Decoder:
    """Greedy decoding of one prompt. drafter=None is AR: a tree of just the root (budget 0)."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig,
                 drafter: Drafter | None = None, timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        if cuda_graph and model.device.type != "cuda":
            raise DecodeError("cuda_graph=True needs the model on a CUDA device")
        self.model, self.cfg, self.drafter = model, cfg, drafter
        self.cuda_graph = cuda_graph
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_out: _StepTensors | None = None
        self.mode = "ar" if drafter is None else "ddtree"
        self.budget = 0 if drafter is None else cfg.budget
        self.depth = 0 if drafter is None else cfg.num_draft_positions  # L
        self.timer = timer or StepTimer(model.device, enabled=False)
        self.prompt = validate_prompt(prompt, model.cfg.vocab_size)
        self.capacity = check_room(len(self.prompt), cfg, model)
        mcfg, dev = model.cfg, model.device
        self.cache = LatentCache(mcfg.num_hidden_layers, self.capacity, mcfg.kv_lora_rank, mcfg.qk_rope_head_dim,
                                 dev, model.dtype)
        slack = cfg.block_size + 1  # the last step may commit past max_new_tokens; a scratch slot follows
        self.generated = torch.zeros(cfg.max_new_tokens + slack, dtype=torch.int64, device=dev)
        self.num_generated = torch.zeros((), dtype=torch.int64, device=dev)
        self.root = torch.zeros((), dtype=torch.int64, device=dev)  # the last committed token, not yet cached
        self.steps: list[StepRecord] = []
        self.logits_rows: list[np.ndarray] = []
        self.tokens: list[int] = []
        self._prefill()

    # -- the device part -------------------------------------------------------------------------
    def _prefill(self) -> None:
        start = time.perf_counter_ns()
        dev = self.model.device
        n = len(self.prompt)
        tokens = torch.tensor(self.prompt, dtype=torch.int64, device=dev)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        logits = self.model.forward(tokens, torch.arange(n, device=dev), causal, self.cache)
        self.cache.prefix_len.fill_(n)
        root = logits[-1].argmax()
        self.generated[0] = root
        self.num_generated.fill_(1)
        self.root.copy_(root)
        check_finite(logits[-1], "prefill")
        self.first_token = int(root)
        self.tokens = [self.first_token]
        self.logits_rows.append(logits[-1].cpu().numpy())
        self.prefill_ns = time.perf_counter_ns() - start

    def _step_tensors(self) -> _StepTensors:
        t, dev = self.timer, self.model.device
        prefix_len = self.cache.prefix_len.clone()
        draft = None
        if self.drafter is None:
            tree = (self.root.clone().view(1), torch.full((1,), -1, dtype=torch.int64, device=dev),
                    torch.zeros(1, dtype=torch.int64, device=dev), torch.zeros(1, dtype=torch.int64, device=dev),
                    torch.zeros(1, dtype=torch.float32, device=dev), torch.ones(1, 1, dtype=torch.bool, device=dev))
        else:
            with t.range("draft"):
                draft = self.drafter.propose(self.generated, self.num_generated, self.depth)
            with t.range("tree_build"):
                tree = ops.tree_build(draft, self.root, self.budget)
        tokens, parents, depths, _, _, visibility = tree
        with t.range("verify"):
            logits = self.model.forward(tokens, depths, visibility, self.cache, t)
            target = logits.argmax(-1)
        with t.range("tree_accept"):
            path, path_len, bonus = ops.tree_accept(tokens, parents, target, self.depth)
        with t.range("kv_compact"):
            self.cache.compact(path, path_len)
        with t.range("commit"):
            # committed tokens = target along the path: each accepted child's token, then the bonus
            i = torch.arange(self.depth + 1, device=dev)
            slots = torch.where(i < path_len, self.num_generated + i, self.generated.shape[0] - 1)
            self.generated.index_put_((slots,), target[path.clamp(min=0)])
            self.num_generated.add_(path_len)
            self.root.copy_(bonus)
        return _StepTensors(prefix_len, tree, logits, target, path, path_len, bonus, draft)

    def advance(self) -> _StepTensors:
        """One step on the device and nothing else: no host sync, no record (step() adds the record).
        Replays the CUDA graph once one is captured. The host-side token list does not move: for timing."""
        if self._graph is not None:
            self._graph.replay()
            return self._graph_out
        return self._step_tensors()

    @property
    def graph_captured(self) -> bool:
        return self._graph is not None

    def capture_graph(self) -> None:
        """Record one step as a CUDA graph (after an eager step warmed everything up); later steps replay it.
        The tree has a static size (B+1) and all state lives in persistent buffers, so replays chain."""
        timer, self.timer = self.timer, StepTimer(self.model.device, enabled=False)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._graph_out = self._step_tensors()
        self.timer = timer

    # -- the host part ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.cfg.max_new_tokens

    def step(self) -> StepRecord:
        if self.done:
            raise DecodeError(f"decode is done: {self.cfg.max_new_tokens} tokens generated; reset to decode again")
        start = time.perf_counter_ns()
        with self.timer.range("step"):
            st = self.advance()
        record = self._record(st)
        if self.cuda_graph and self._graph is None:
            self.capture_graph()
        record.wall_ns = time.perf_counter_ns() - start
        self.steps.append(record)
        return record

    def _record(self, st: _StepTensors) -> StepRecord:
        # Only small things cross to the host: [N, V] logits would be 168 MB at B = 256 and Kimi-K2's vocabulary.
        tokens, parents, depths, ranks, scores, visibility = (x.cpu() for x in st.tree)
        check_finite(st.logits, f"step {len(self.steps)}")
        if st.draft is not None and torch.isnan(st.draft).any():
            raise DecodeError(f"step {len(self.steps)}: the drafter returned NaN log-probabilities")
        top2 = st.logits.topk(min(2, st.logits.shape[1]), dim=-1).values.cpu().numpy()  # [N, 1 or 2]
        path_len = int(st.path_len)
        path_index = st.path[:path_len]
        path = path_index.tolist()
        target = st.target.cpu().tolist()
        committed = [target[n] for n in path]
        self.tokens.extend(committed)
        self.logits_rows.extend(st.logits.index_select(0, path_index).cpu().numpy())
        return StepRecord(
            index=len(self.steps), mode=self.mode, prefix_len=int(st.prefix_len),
            tree=TreeRecord(tokens=tokens.tolist(), parents=parents.tolist(), depths=depths.tolist(),
                            ranks=ranks.tolist(), scores=scores.tolist(), visibility=visibility.numpy()),
            target=target, logit_gap=(top2[:, 0] - top2[:, -1]).tolist(), path=path, bonus=int(st.bonus),
            committed=committed, timings_ns=self.timer.results_ns(), spans=self.timer.last_spans(),
        )

    def run(self, on_step: Callable[[StepRecord], None] | None = None) -> RunRecord:
        while not self.done:
            record = self.step()
            if on_step is not None:
                on_step(record)
        return self.record()

    def record(self) -> RunRecord:
        """The run so far (generated tokens truncated to max_new_tokens)."""
        n = min(len(self.tokens), self.cfg.max_new_tokens)
        return RunRecord(
            mode=self.mode, model=self.model.cfg.to_dict(), decode=self.cfg.to_dict(), prompt=list(self.prompt),
            first_token=self.first_token, steps=list(self.steps), prefill_ns=self.prefill_ns,
            tokens=self.tokens[:n], logits=np.stack(self.logits_rows[:n]),
            wall_ns=self.prefill_ns + sum(s.wall_ns for s in self.steps),
            drafter=self.drafter.describe() if self.drafter is not None else {},
        )


class ARDecoder(Decoder):
    """Plain greedy decoding: every step verifies the root alone and commits one token."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig,
                 timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        super().__init__(model, prompt, cfg, None, timer, cuda_graph)


class DDTreeDecoder(Decoder):
    """Draft a tree with `drafter`, verify it in one forward, commit the accepted path plus the bonus."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig, drafter: Drafter,
                 timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        super().__init__(model, prompt, cfg, drafter, timer, cuda_graph)


def validate_prompt(prompt: Sequence[int], vocab_size: int) -> list[int]:
    ids = [int(t) for t in prompt]
    if not ids:
        raise DecodeError("the prompt is empty: give at least one token id")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise DecodeError(f"prompt token id(s) {bad[:5]} out of range: ids must be in [0, {vocab_size})")
    return ids


def check_room(prompt_len: int, cfg: DecodeConfig, model: TargetModel) -> int:
    """Cache rows a decode needs; raises if its positions exceed the model's context."""
    last_position = prompt_len + cfg.max_new_tokens + cfg.block_size
    limit = model.cos.shape[0]
    if last_position > limit:
        raise DecodeError(
            f"prompt of {prompt_len} tokens + max_new_tokens {cfg.max_new_tokens} + block_size {cfg.block_size} "
            f"needs {last_position} positions, more than the cache's {limit} (max_position_embeddings): "
            "shorten the prompt or lower max_new_tokens")
    return prompt_len + cfg.max_new_tokens + cfg.block_size + cfg.budget + 1


def check_finite(logits: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(logits).all()):
        raise DecodeError(f"{where}: the target model produced non-finite logits (NaN or Inf); check the weights "
                          "and the dtype (bfloat16 overflow?)")
