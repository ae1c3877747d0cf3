"""DDTree with its budget chosen every step (`--budget auto`, `auto:MAX`): the tree is built once at MAX and the
policy of engine/decoding/budget.py picks the truncation to verify, b = 0 included.

A drafted step runs in two parts: the draft (propose, tree_build at MAX, the expected accepted tokens at every
bucket), then one small device-to-host read of those few numbers, the choice, and the verify of the chosen
truncation (the first b + 1 nodes of the tree and the top-left block of its mask). With CUDA graphs each part is
a captured graph: one for the draft and one per bucket for the verify, all over the same static buffers. When the
best choice is b = 0 the drafts are not paying, so the next steps are AR steps taken without a draft, for 1, 2,
4, ... MAX_BACKOFF steps while drafting keeps choosing 0; a drafted step that chooses b > 0 ends the back-off (that
drafted step itself verifies the smallest tree, so the calibration keeps learning). An AR step costs what plain AR
costs: the drafter is not told of its token then, the token's hidden states wait in a buffer, and the next drafted
step first tells the drafter of all of them in one commit (one read of the drafter's context weights for the whole
back-off instead of one per token). The calibration, the back-off reached and the start-up costs carry over from
one decode to the next on the same model and drafter. Every step verifies a valid tree, so the output is AR's
whatever is chosen.
"""
from __future__ import annotations

import functools
import json
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config import DecodeConfig, buckets_up_to
from engine.decoding.budget import (
    Choice,
    CostTable,
    choose,
    confidence_prior,
    expected_accepted,
    learn_confidence,
    log_confidence,
)
from engine.decoding.decoder import DecodeError, Decoder, _StepTensors
from engine.decoding.trees import root_tree
from engine.drafters import Drafter
from engine.model.target import TargetModel
from engine.records import BudgetChoice, StepRecord
from engine.timers import StepTimer
from kernels import ops

# AR steps at most between two drafted probes: a probe costs a draft and a two-node verify (about three AR steps at
# Kimi-K2 width), so with a drafter that never hits the probes cost about 1% of the steps at this spacing.
MAX_BACKOFF = 256
CALIBRATION_REPEATS = 3  # timed rounds over the buckets at start-up (after one untimed), the best of each kept


@dataclass(slots=True)
class DrafterTrack:
    """What a run learned of a drafter on a model: the confidence correction's evidence (on the device) and the
    back-off it reached. Carried from one decode to the next."""

    realised: torch.Tensor  # [L + 1, RANK_CLASSES]
    predicted: torch.Tensor  # [L + 1, RANK_CLASSES]
    backoff: int = 1  # AR steps after the next drafted step that chooses b = 0


# Start-up step costs per model and decode setting, measured once per process, and each drafter's track per model
# (weak: they go with the model).
_COSTS: weakref.WeakKeyDictionary[TargetModel, dict[tuple, list[float]]] = weakref.WeakKeyDictionary()
_TRACKS: weakref.WeakKeyDictionary[TargetModel, dict[tuple, DrafterTrack]] = weakref.WeakKeyDictionary()


def truncate(tree: Sequence[torch.Tensor], budget: int) -> tuple[torch.Tensor, ...]:
    """The first budget + 1 nodes of a best-first tree (views), and a copy of its mask's top-left block (verify_attn
    reads a contiguous mask; (b + 1)^2 bytes)."""
    tokens, parents, depths, ranks, scores, visibility = tree
    n = budget + 1
    return tokens[:n], parents[:n], depths[:n], ranks[:n], scores[:n], visibility[:n, :n].contiguous()


class AutoBudgetDecoder(Decoder):
    """DDTree whose every step verifies the truncation with the most expected tokens per second."""

    def __init__(self, model: TargetModel, prompt: Sequence[int], cfg: DecodeConfig, drafter: Drafter,
                 timer: StepTimer | None = None, cuda_graph: bool = False) -> None:
        if cfg.budget < 1:
            raise DecodeError(f"an auto budget needs a largest tree of at least 1 node, got budget={cfg.budget}")
        super().__init__(model, prompt, cfg, "ddtree", drafter, timer, cuda_graph)
        dev = model.device
        self.buckets = buckets_up_to(cfg.budget)
        self._bucket_index = torch.tensor(self.buckets, device=dev)
        drafter_key = (json.dumps(drafter.describe(), sort_keys=True, default=str), self.depth)
        tracks = _TRACKS.setdefault(model, {})
        if drafter_key not in tracks:
            tracks[drafter_key] = DrafterTrack(*confidence_prior(self.depth, dev))
        self.track = tracks[drafter_key]
        self._realised, self._predicted = self.track.realised, self.track.predicted
        quiet, self.timer = self.timer, StepTimer(dev, enabled=False)  # no stage ranges in the calibration
        self.costs = CostTable(self.buckets, list(self._startup_costs()))
        self.timer = quiet
        self.ar_steps_left = 0  # AR steps to take before the next drafted probe
        self.last_choice: Choice | None = None
        self.budget_counts: Counter[int] = Counter()  # steps per verified budget (0: an AR step without a draft)
        self.choice_s: list[float] = []  # per drafted step: the draft's end to the verify's launch (the host read)
        self.capture_s = 0.0  # host seconds spent capturing graphs (each part's, the first time it runs)
        self._drafted = False  # whether the step in flight drafted
        # The back-off's AR steps not yet told to the drafter: their hidden states, in order, and their number (on
        # the host, for the step's control flow, and on the device, for the drafter's commit inside graphs).
        self.num_pending = 0
        width = len(self.hidden_layers) * model.cfg.hidden_size  # allocated here: never inside a graph's capture
        self._pending_hidden = (torch.zeros(MAX_BACKOFF, width, device=dev, dtype=model.dtype) if width
                                else None)  # [MAX_BACKOFF, len(hidden_layers) * H]
        self._pending_len = torch.zeros((), dtype=torch.int64, device=dev)
        self._pending_path = torch.arange(MAX_BACKOFF, device=dev)
        self._graphs: dict[object, torch.cuda.CUDAGraph] = {}
        self._graph_out: dict[object, object] = {}
        self._to_capture: list[object] = []
        self._timing: tuple | None = None  # the last step's (bucket, start, end, drafted, launched): events on CUDA,
        # seconds on the CPU; drafted and launched are None for an AR step

    # -- start-up calibration --------------------------------------------------------------------
    def _startup_costs(self) -> list[float]:
        """Seconds of a step at each bucket on this model, measured once per process for these settings: the draft
        and a verify forward of the real tree's first b + 1 nodes (its KV rows land in scratch slots past the
        prefix; nothing is committed), as captured graphs where the decode replays graphs. Bucket 0 is an AR step
        without a draft. Rounds interleave the buckets so that a slow moment of the machine hits them alike."""
        key = (self.drafter.name, self.buckets, self.cfg.dtype, self.cfg.batch_invariant, self.depth, self.cuda_graph)
        known = _COSTS.setdefault(self.model, {})
        if key not in known:
            steps = [functools.partial(self._calibration_step, b) for b in self.buckets]
            if self.cuda_graph:
                steps = [self._graphed(step) for step in steps]
            for step in steps:
                step()  # untimed: first-touch allocations and kernel selection stay out
            best = [float("inf")] * len(steps)
            for _ in range(CALIBRATION_REPEATS):
                for i, step in enumerate(steps):
                    best[i] = min(best[i], self._time(step))
            known[key] = best
        return known[key]

    def _calibration_step(self, budget: int) -> None:
        tree = root_tree(self.root) if budget == 0 else truncate(self._draft_part()[0], budget)
        tokens, _, depths, _, _, visibility = tree
        self.model.forward(tokens, depths, visibility, self.cache, hidden_layers=self.hidden_layers,
                           row_block=self.row_block)

    def _graphed(self, fn):
        """fn captured as a CUDA graph (after one eager run); returns its replay."""
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    def _time(self, fn) -> float:
        self._sync()
        start = time.perf_counter()
        fn()
        self._sync()
        return max(time.perf_counter() - start, 1e-9)

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    # -- the step ----------------------------------------------------------------------------------
    def _draft_part(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the tree at MAX, the draft, the prefix length before the step, expected accepted at each bucket)."""
        prefix_len = self.cache.prefix_len.clone()
        with self.timer.range("draft"):
            draft = self.drafter.propose(self.root, self.num_generated)
        with self.timer.range("tree_build"):
            tree = ops.tree_build(draft, self.root, self.cfg.budget)
        _, parents, depths, ranks, scores, _ = tree
        factors = log_confidence(self._realised, self._predicted)
        expected = expected_accepted(scores, parents, depths, ranks, factors).index_select(0, self._bucket_index)
        return tuple(tree), draft, prefix_len, expected

    def _verify_part(self, prefix_len: torch.Tensor, tree: tuple[torch.Tensor, ...], draft: torch.Tensor,
                     budget: int) -> _StepTensors:
        """Verify the drafted tree's truncation at budget and add what it showed to the drafter's calibration."""
        tree = truncate(tree, budget)
        out = self._verify_and_commit(prefix_len, tree, draft)
        _, parents, depths, ranks, scores, _ = tree
        learn_confidence(self._realised, self._predicted, parents, depths, ranks, scores, out.path, out.path_len)
        return out

    def _ar_part(self) -> _StepTensors:
        """An AR step without a draft: the root's verify, its hidden states kept for the drafter's next commit."""
        out, hidden = self._verify_and_accept(self.cache.prefix_len.clone(), root_tree(self.root), None)
        if hidden is not None:
            self._pending_hidden.index_copy_(0, self._pending_len.view(1), hidden)
        self._pending_len.add_(1)
        return out

    def _catch_up_part(self, num_steps: int) -> None:
        """Tell the drafter of the last num_steps AR steps' tokens at once, as one commit of a path of num_steps
        nodes (each an AR step's root, in order)."""
        hidden = None if self._pending_hidden is None else self._pending_hidden[:num_steps]
        with self.timer.range("draft_update"):
            self.drafter.commit(self._pending_path[:num_steps], self._pending_len, hidden)
        self._pending_len.zero_()

    def _verify_from_graph(self, budget: int) -> _StepTensors:
        """The verify part at budget over the captured draft's outputs (static buffers)."""
        tree, draft, prefix_len, _ = self._graph_out["draft"]
        return self._verify_part(prefix_len, tree, draft, budget)

    def _run(self, key: object, fn):
        """fn's outputs: from its captured graph where there is one, else run eagerly (and captured at the end of
        this step when CUDA graphs are on and the inputs it reads are a captured graph's static buffers)."""
        if key in self._graphs:
            self._graphs[key].replay()
            return self._graph_out[key]
        if self.cuda_graph and (key == "draft" or key == "ar" or "draft" in self._graphs):
            self._to_capture.append((key, fn))
        return fn()

    def advance(self) -> _StepTensors:
        """One step: an AR step without a draft while backing off, else (after telling the drafter of the back-off's
        tokens) the draft, the choice (the step's one small device-to-host read, which also finds the previous step
        done, so its time is read without a wait) and the verify of the chosen truncation. A drafted step whose
        best choice is 0 still verifies the smallest tree, so the calibration keeps learning, and starts the
        back-off."""
        self._observe_last_step()  # if the previous step is done already
        drafted = launched = None
        if self.ar_steps_left > 0:
            start = self._mark()
            self.ar_steps_left -= 1
            self._drafted, budget = False, 0
            self.num_pending += 1
            out = self._run("ar", self._ar_part)
        else:
            if self.num_pending:
                self._run(("catch_up", self.num_pending), functools.partial(self._catch_up_part, self.num_pending))
                self.num_pending = 0
            start = self._mark()
            self._drafted = True
            tree, draft, prefix_len, expected = self._run("draft", self._draft_part)
            drafted = self._mark()
            choice = self._agreed(choose(expected.tolist(), self.costs))
            self._observe_last_step()
            self.last_choice = choice
            track = self.track
            if choice.budget == 0:
                self.ar_steps_left, track.backoff = track.backoff, min(2 * track.backoff, MAX_BACKOFF)
                budget = self.buckets[1]
            else:
                track.backoff, budget = 1, choice.budget
            launched = self._mark()
            out = self._run(("verify", budget), functools.partial(self._verify_part, prefix_len, tree, draft, budget))
        self.budget_counts[budget if self._drafted else 0] += 1
        self._timing = (budget if self._drafted else 0, start, self._mark(), drafted, launched)  # bucket 0: AR
        if self._to_capture:
            self.capture_graph()
        return out

    def _agreed(self, choice: Choice) -> Choice:
        """Across the ranks of a parallel model, rank 0's choice (each rank's timings differ, and the ranks must
        verify the same tree); alone, the choice itself."""
        shard = self.model.shard
        if shard is None:
            return choice
        chosen = torch.tensor([choice.budget if shard.rank == 0 else 0], device=self.model.device)
        shard.all_reduce(chosen)
        budget = int(chosen)
        return Choice(budget, choice.expected, choice.cost_s, choice.value)

    def _mark(self):
        """A point in the step's time line: a recorded CUDA event on the GPU (read later, never waited for), the
        host clock on the CPU."""
        if self.model.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle_timing(self) -> None:
        """Wait for the step in flight and take in its time (its bucket's cost, its choice's host read)."""
        self._sync()
        self._observe_last_step()

    def _observe_last_step(self) -> None:
        """Refresh the running cost of the last step's bucket, once its end is known to be past."""
        if self._timing is None:
            return
        budget, start, end, drafted, launched = self._timing
        if isinstance(end, torch.cuda.Event) and not end.query():
            return
        self.costs.observe(budget, max(_seconds(start, end), 1e-9))
        if drafted is not None:
            self.choice_s.append(_seconds(drafted, launched))
        self._timing = None

    @property
    def graph_captured(self) -> bool:
        return bool(self._graphs)

    def capture_graph(self) -> None:
        """Capture the parts that ran eagerly in this step (advance calls it; the base class's call after the first
        step finds nothing left to capture). With the draft's graph come the AR step's and every bucket's verify
        (over the draft graph's outputs; the start-up calibration ran each shape), so that no later step runs a
        part eagerly the first time it chooses it; a catch-up's graph is captured after its first, eager run."""
        if self._to_capture and self._to_capture[0][0] == "draft" and "draft" not in self._graphs:
            self._to_capture = self._to_capture[:1]  # this step's verify read the eager draft's tensors
            self._to_capture.append(("ar", self._ar_part))
            self._to_capture += [(("verify", b), functools.partial(self._verify_from_graph, b))
                                 for b in self.buckets[1:]]
        self._sync()  # the work in flight is the decode's: only the capture itself is counted in capture_s
        begun = time.perf_counter()
        timer, self.timer = self.timer, StepTimer(self.model.device, enabled=False)
        for key, fn in self._to_capture:
            if key not in self._graphs:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._graph_out[key] = fn()
                self._graphs[key] = graph
        self._to_capture.clear()
        self.timer = timer
        self._sync()
        self.capture_s += time.perf_counter() - begun

    def step(self) -> StepRecord:
        record = super().step()
        choice = self.last_choice
        if choice is not None:
            factors = log_confidence(self._realised, self._predicted).exp().tolist()
            record.budget = BudgetChoice(chosen=choice.budget if self._drafted else 0, drafted=self._drafted,
                                         buckets=list(self.buckets), expected=list(choice.expected),
                                         cost_s=list(choice.cost_s), value=list(choice.value), confidence=factors)
        return record


def _seconds(start, end) -> float:
    """Seconds between two of _mark's points (CUDA events, both past; or host clock readings)."""
    if isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1e3
    return end - start
