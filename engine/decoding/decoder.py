"""AR and DDTree decoders: step() -> StepRecord, run() -> RunRecord.

A step works on device tensors only (draft, tree_build, verify, tree_accept, kv_compact, commit) and
never reads them on the host, so on CUDA it needs no synchronisation and can be graph-captured. The
record of the step is read afterwards, off the hot path.
"""
from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import DecodeConfig
from engine.decoding.node_probs import node_probs
from engine.decoding.sampling import pick
from engine.decoding.trees import RootTree, chain_tree
from engine.drafters import Drafter
from engine.model.cache import LatentCache
from engine.model.target import TargetModel
from engine.records import MODES, ExpertTraffic, RunRecord, StepRecord, TreeRecord
from engine.timers import StepTimer
from kernels import ops
from kernels.graph_upload import upload_graph

# The stages of a step, in the order they run: each is a StepTimer range "step/<stage>". draft and
# draft_update are the drafter's (its proposal, and taking in the accepted nodes); AR has neither.
STAGES = ("draft", "tree_build", "verify", "tree_accept", "kv_compact", "commit", "draft_update")


class DecodeError(ValueError):
    """A decode cannot start or go on: bad prompt, no room in the cache, non-finite logits."""


@dataclass(slots=True)
class _StepTensors:
    """One step's device results, read into a StepRecord after the step."""

    prefix_len: torch.Tensor
    tree: tuple[torch.Tensor, ...]  # tokens, parents, depths, ranks, scores, visibility
    logits: torch.Tensor  # [N, V] in the model's dtype (the forward's float_logits False)
    target: torch.Tensor  # [N]
    path: torch.Tensor  # [L + 1], -1 padded
    path_len: torch.Tensor
    bonus: torch.Tensor
    draft: torch.Tensor | None  # [L, V] draft log-probs (DDTree only)


class Decoder:
    """Decoding of one prompt in one mode: "ar" (no drafter: a tree of just the root), "chain" (the drafter's
    top-1 token per depth, L + 1 nodes) or "ddtree" (the best-first tree of B + 1 nodes). The target picks
    greedily or samples at every node, as DecodeConfig says (engine/decoding/sampling.py)."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig, mode: str = "ar",
                 drafter: Drafter | None = None, timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        check_arguments(model, prompt, cfg)
        if mode not in MODES:
            raise DecodeError(f"mode={mode!r}: expected one of {MODES}")
        if (drafter is None) != (mode == "ar"):
            raise DecodeError(f"mode {mode!r} {'takes no' if mode == 'ar' else 'needs a'} drafter")
        if cuda_graph and model.device.type != "cuda":
            raise DecodeError("cuda_graph=True needs the model on a CUDA device")
        self.model, self.cfg, self.drafter, self.mode = model, cfg, drafter, mode
        self.cuda_graph = cuda_graph
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_out: _StepTensors | None = None
        self.depth = 0 if mode == "ar" else cfg.num_draft_positions  # L
        self.num_nodes = {"ar": 1, "chain": self.depth + 1, "ddtree": cfg.budget + 1}[mode]
        self.hidden_layers = () if drafter is None else check_hidden_layers(drafter, model)
        self.timer = timer or StepTimer(model.device, enabled=False)
        self.prompt = validate_prompt(prompt, model.cfg.vocab_size)
        self.capacity = check_room(len(self.prompt), cfg, model, self.num_nodes)
        mcfg, dev = model.cfg, model.device
        last_position = len(self.prompt) + cfg.max_new_tokens + cfg.block_size
        self.cache = LatentCache(mcfg.num_hidden_layers, self.capacity, mcfg.kv_lora_rank, mcfg.qk_rope_head_dim,
                                 dev, model.dtype, model.rope(last_position + 1))
        slack = cfg.block_size + 1  # the last step may commit past max_new_tokens
        self.generated = torch.zeros(cfg.max_new_tokens + slack, dtype=torch.int64, device=dev)
        self.num_generated = torch.zeros((), dtype=torch.int64, device=dev)
        self.root = torch.zeros((), dtype=torch.int64, device=dev)  # the last committed token, not yet cached
        self.root_tree = RootTree(dev)
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
        logits, hidden = self.model.forward(tokens, torch.arange(n, device=dev), causal, self.cache,
                                            hidden_layers=self.hidden_layers, batch_invariant=self.cfg.batch_invariant)
        self.cache.prefix_len.fill_(n)
        root = pick(logits[-1:], torch.full((1,), n, device=dev), self.cfg)[0]
        self.generated[0] = root
        self.num_generated.fill_(1)
        self.root.copy_(root)
        check_finite(logits[-1], "prefill")
        if self.drafter is not None:
            self.drafter.begin(tokens, hidden)
        self.first_token = int(root)
        self.tokens = [self.first_token]
        self.logits_rows.append(logits[-1].cpu().numpy())
        self.prefill_ns = time.perf_counter_ns() - start

    def _draft(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """The step's tree (and the draft it came from; None for AR)."""
        t = self.timer
        if self.drafter is None:
            return self.root_tree(self.root), None
        with t.range("draft"):
            draft = self.drafter.propose(self.root, self.num_generated)
        check_draft(draft, self.depth, self.model, self.drafter.name, len(self.steps))
        with t.range("tree_build"):
            if self.mode == "chain":
                return chain_tree(draft, self.root), draft
            return ops.tree_build(draft, self.root, self.cfg.budget), draft

    def _step_tensors(self) -> _StepTensors:
        prefix_len = self.cache.prefix_len.clone()
        tree, draft = self._draft()
        return self._verify_and_commit(prefix_len, tree, draft)

    def _verify_and_commit(self, prefix_len: torch.Tensor, tree: tuple[torch.Tensor, ...],
                           draft: torch.Tensor | None) -> _StepTensors:
        """Verify the tree, accept its path, compact the cache, commit the tokens and tell the drafter."""
        out, hidden = self._verify_and_accept(prefix_len, tree, draft)
        if self.drafter is not None:
            with self.timer.range("draft_update"):
                self.drafter.commit(out.path, out.path_len, hidden)
        return out

    def _verify_and_accept(self, prefix_len: torch.Tensor, tree: tuple[torch.Tensor, ...],
                           draft: torch.Tensor | None) -> tuple[_StepTensors, torch.Tensor | None]:
        """Verify the tree, accept its path, compact the cache and commit the tokens; the step's results and the
        verified nodes' hidden states the drafter reads (None when it reads none), not yet told to the drafter."""
        t = self.timer
        tokens, parents, depths, _, _, visibility = tree
        with t.range("verify"):
            logits, hidden = self.model.forward(tokens, depths, visibility, self.cache, t, self.hidden_layers,
                                                self.cfg.batch_invariant, float_logits=False)
            positions = prefix_len + depths + 1 if self.cfg.temperature > 0 else None  # node i chooses i's + 1
            target = pick(logits, positions, self.cfg)
        with t.range("tree_accept"):
            path, path_len, bonus = ops.tree_accept(tokens, parents, target, self.depth)
        with t.range("kv_compact"):
            self.cache.compact(path)
        with t.range("commit"):
            # committed tokens = target along the path (each accepted child's token, then the bonus); the counters
            # and the cache's prefix move on by path_len, and the bonus is the next root: one launch
            ops.commit_path(target, path, path_len, bonus, self.generated, self.num_generated, self.root,
                            self.cache.prefix_len)
        return _StepTensors(prefix_len, tree, logits, target, path, path_len, bonus, draft), hidden

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
        """Record one step as a CUDA graph (after an eager step warmed everything up) and upload it; later steps
        replay it. The tree has a static size (B+1) and all state lives in persistent buffers, so replays chain."""
        timer, self.timer = self.timer, StepTimer(self.model.device, enabled=False)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._graph_out = self._step_tensors()
        upload_graph(self._graph)
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
        top2 = st.logits.topk(min(2, st.logits.shape[1]), dim=-1).values.float().cpu().numpy()  # [N, 1 or 2]
        path_len = int(st.path_len)
        path_index = st.path[:path_len]
        path = path_index.tolist()
        target = st.target.cpu().tolist()
        committed = [target[n] for n in path]
        self.tokens.extend(committed)
        self.logits_rows.extend(st.logits.index_select(0, path_index).float().cpu().numpy())
        probs = node_probs(st.logits, st.tree, st.draft, self.cfg)
        # the expert counts stay in the model's buffer until the next forward: read here, not inside the step
        experts = (ExpertTraffic(self.model.experts_touched().tolist(), self.model.bytes_per_expert)
                   if self.model.num_moe_layers else None)
        return StepRecord(
            index=len(self.steps), mode=self.mode, prefix_len=int(st.prefix_len),
            tree=TreeRecord(tokens=tokens.tolist(), parents=parents.tolist(), depths=depths.tolist(),
                            ranks=ranks.tolist(), scores=scores.tolist(), visibility=visibility.numpy()),
            target=target, logit_gap=(top2[:, 0] - top2[:, -1]).tolist(), path=path, bonus=int(st.bonus),
            committed=committed, timings_ns=self.timer.results_ns(), spans=self.timer.last_spans(), probs=probs,
            experts=experts,
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
            parallel=self.model.layout(),
        )


class ARDecoder(Decoder):
    """Plain autoregressive decoding: every step verifies the root alone and commits one token."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig,
                 timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        super().__init__(model, prompt, cfg, "ar", None, timer, cuda_graph)


class DDTreeDecoder(Decoder):
    """Draft a tree with `drafter`, verify it in one forward, commit the accepted path plus the bonus."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig, drafter: Drafter,
                 timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        super().__init__(model, prompt, cfg, "ddtree", drafter, timer, cuda_graph)


def check_arguments(model: object, prompt: object, cfg: object) -> None:
    """The constructor's arguments are of the types it takes (a clear error for a swapped or missing one)."""
    if not isinstance(model, TargetModel):
        raise DecodeError(f"model is a {type(model).__name__}: pass a TargetModel (TargetModel.from_checkpoint(ckpt))")
    if isinstance(prompt, torch.Tensor | np.ndarray):
        raise DecodeError(f"prompt is a {type(prompt).__name__}: pass the token ids as a list of ints "
                          "(prompt.tolist())")
    if prompt is None or isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
        raise DecodeError(f"prompt is {type(prompt).__name__}: pass the token ids as a list of ints (encode text "
                          "with the model's tokenizer first)")
    if not isinstance(cfg, DecodeConfig):
        raise DecodeError(f"cfg is a {type(cfg).__name__}: pass a DecodeConfig")


def validate_prompt(prompt: Sequence[int], vocab_size: int) -> list[int]:
    """Token ids as a list of ints: integers only (numpy integers too; no floats, strings or bools), in range."""
    not_ids = [t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)]
    if not_ids:
        raise DecodeError(f"prompt entries {not_ids[:5]!r} are not integer token ids")
    ids = [int(t) for t in prompt]
    if not ids:
        raise DecodeError("the prompt is empty: give at least one token id")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise DecodeError(f"prompt token id(s) {bad[:5]} out of range: ids must be in [0, {vocab_size})")
    return ids


def check_room(prompt_len: int, cfg: DecodeConfig, model: TargetModel, num_nodes: int) -> int:
    """Cache rows a decode of trees of num_nodes needs; raises if its positions exceed the model's context."""
    check_positions(prompt_len, cfg, model.cfg.max_position_embeddings)
    return prompt_len + cfg.max_new_tokens + cfg.block_size + num_nodes


def check_positions(prompt_len: int, cfg: DecodeConfig, limit: int) -> None:
    """Raises if a decode of cfg after a prompt of prompt_len tokens needs more than `limit` positions."""
    last_position = prompt_len + cfg.max_new_tokens + cfg.block_size
    if last_position > limit:
        raise DecodeError(
            f"prompt of {prompt_len} tokens + max_new_tokens {cfg.max_new_tokens} + block_size {cfg.block_size} "
            f"needs {last_position} positions, more than the cache's {limit} (max_position_embeddings): "
            "shorten the prompt or lower max_new_tokens")


def check_hidden_layers(drafter: Drafter, model: TargetModel) -> tuple[int, ...]:
    layers = tuple(drafter.hidden_layers)
    bad = [i for i in layers if not 0 <= i < model.cfg.num_hidden_layers]
    if bad:
        raise DecodeError(f"drafter {drafter.name!r} asks for the hidden states of target layer(s) {bad}, but the "
                          f"target has layers 0..{model.cfg.num_hidden_layers - 1}")
    return layers


def check_draft(draft: torch.Tensor, depth: int, model: TargetModel, name: str, step: int) -> None:
    """A proposal's shape, dtype and device (metadata only: no host sync), and on the CPU its values."""
    want = (depth, model.cfg.vocab_size)
    if not isinstance(draft, torch.Tensor) or tuple(draft.shape) != want or draft.dtype != torch.float32 \
            or draft.device != model.device:
        got = (f"{tuple(draft.shape)} {draft.dtype} on {draft.device}" if isinstance(draft, torch.Tensor)
               else type(draft).__name__)
        raise DecodeError(f"step {step}: drafter {name!r} proposed {got}; expected float32 log-probabilities "
                          f"{want} (L = block_size - 1 positions by the vocabulary) on {model.device}")
    if draft.requires_grad:
        raise DecodeError(f"step {step}: drafter {name!r} proposed a tensor that requires grad; propose under "
                          "torch.no_grad() (or return .detach())")
    if draft.device.type == "cpu" and bool(torch.isnan(draft).any()):  # on CUDA: checked in the step's record
        raise DecodeError(f"step {step}: the drafter returned NaN log-probabilities")


def check_finite(logits: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(logits).all()):
        raise DecodeError(f"{where}: the target model produced non-finite logits (NaN or Inf); check the weights "
                          "and the dtype (bfloat16 overflow?)")
