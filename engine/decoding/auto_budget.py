"""DDTree with its budget chosen every step (`--budget auto`, `auto:MAX`): the tree is built once, up to MAX nodes,
and the policy of engine/decoding/budget.py picks the truncation to verify, b = 0 included.

A drafted step is one piece of device work: the draft (propose, tree_build with MAX's shapes but only build_limit()
nodes popped, about twice what the last steps chose, the expected accepted tokens at every bucket), the choice
(expected tokens per second against the cost table, on the device) and the verify of the chosen truncation (the
first b + 1 nodes of the tree and the top-left block of its mask). With CUDA graphs it is one captured graph whose
verify is a switch node over one branch per bucket (kernels/graph_switch.py), so the choice costs no read back to
the host; eagerly, the chosen index is read and that bucket's verify runs.

The host learns what each step chose when the step is done, without waiting for it: every step's chosen bucket and
committed count are copied to pinned memory behind it, and read once its end event has passed; the host runs at most
MAX_IN_FLIGHT steps ahead of what it has read. From what it reads it refreshes the cost table (the step's time, from
CUDA events, for the bucket it verified), which the next drafted step reads from the device, and it backs off: when
the best choice is b = 0 the drafts are not paying, so the next steps are AR steps taken without a draft, for 1, 2,
4, ... MAX_BACKOFF steps while drafting keeps choosing 0; a drafted step that chooses b > 0 ends the back-off (a
drafted step that chooses 0 still verifies the smallest tree, so the calibration keeps learning). An AR step costs
what plain AR costs: the drafter is not told of its token then, the token's hidden states wait in a buffer, and the
next drafted step first tells the drafter of all of them in one commit. The confidence correction, the back-off
reached and the cost table (budget.CostTable) carry over from one decode to the next on the same model and drafter.
Every step verifies a valid tree, so the output is AR's whatever is chosen.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
import weakref
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config import DecodeConfig, buckets_up_to
from engine.decoding.budget import CostTable, choose, confidence_prior, learn_confidence, log_confidence
from engine.decoding.decoder import DecodeError, Decoder, _StepTensors
from engine.decoding.in_flight import InFlight
from engine.drafters import Drafter
from engine.model.target import TargetModel
from engine.records import BudgetChoice, StepRecord
from engine.timers import StepTimer
from kernels import ops
from kernels.graph_switch import graph_switch, side_stream
from kernels.graph_upload import upload_graph

# AR steps at most between two drafted probes: a probe costs a draft and a two-node verify (about three AR steps at
# Kimi-K2 width), so with a drafter that never hits the probes cost about 1% of the steps at this spacing.
MAX_BACKOFF = 256
CALIBRATION_REPEATS = 3  # timed rounds over the buckets at start-up (after one untimed), the median of each kept
CALIBRATION_REPLAYS = 4  # on a GPU, back-to-back runs per bucket and round, their median its time
MAX_IN_FLIGHT = 2  # steps the host may launch ahead of the last one whose choice it has read
LIMIT_WINDOW = 8  # drafted steps whose choices set the next tree's build limit (build_limit)


@dataclass(slots=True)
class DrafterTrack:
    """What a run learned of a drafter on a model: the confidence correction's evidence (on the device) and the
    back-off it reached. Carried from one decode to the next."""

    realised: torch.Tensor  # [L + 1, RANK_CLASSES]
    predicted: torch.Tensor  # [L + 1, RANK_CLASSES]
    backoff: int = 1  # AR steps after the next drafted step that chooses b = 0


@dataclass(slots=True)
class DraftedStep:
    """A drafted step's device results: the verify of every bucket (only the chosen one ran; outputs[i] is bucket
    i's, None where an eager step did not run it; bucket 0's verifies the smallest tree), the chosen bucket's index
    (0: an AR step was best) and the curves it was read from."""

    outputs: list[_StepTensors | None]
    chosen: torch.Tensor  # 0-dim int64
    expected: torch.Tensor  # [num_buckets] expected accepted drafted tokens (corrected)
    value: torch.Tensor  # [num_buckets] (1 + expected) / cost: expected tokens per second

    def verified(self, chosen: int) -> _StepTensors:
        return self.outputs[chosen]


# The cost table per model and decode setting, calibrated once per process, and each drafter's track per model
# (weak: they go with the model).
_COSTS: weakref.WeakKeyDictionary[TargetModel, dict[tuple, CostTable]] = weakref.WeakKeyDictionary()
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
        if cuda_graph:
            self._side = side_stream(dev)  # before any capture: making it synchronises
        self._cost = torch.ones(len(self.buckets), device=dev)  # the cost table as the drafted step reads it
        self._limit = torch.tensor(cfg.budget, device=dev)  # the nodes the drafted step builds (ops.tree_build)
        self.recent_choices: deque[int] = deque(maxlen=LIMIT_WINDOW)  # budgets the last drafted steps chose
        self._in_flight = InFlight(dev, MAX_IN_FLIGHT, len(self.buckets))
        quiet, self.timer = self.timer, StepTimer(dev, enabled=False)  # no stage ranges in the calibration
        self.costs = self._cost_table()
        self.timer = quiet
        self.ar_steps_left = 0  # AR steps to take before the next drafted probe
        self.budget_counts: Counter[int] = Counter()  # steps per verified budget (0: an AR step without a draft)
        self.num_seen_generated = 1  # the committed count as of the last step the host has read
        self.capture_s = 0.0  # host seconds spent capturing and uploading graphs (each part's, the first time)
        self.last_choice: BudgetChoice | None = None  # the last drafted step's decision, as step() recorded it
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
        self._capture_pool: tuple[int, int] | None = None  # the memory pool of the graph being captured

    # -- start-up calibration --------------------------------------------------------------------
    def _cost_table(self) -> CostTable:
        """The cost table of this model and these settings, calibrated once per process and carried from decode to
        decode: the seconds of the draft and a verify forward of the real tree's first b + 1 nodes at each bucket
        (its KV rows land in scratch slots past the prefix; nothing is committed), as captured graphs where the
        decode replays graphs; bucket 0 is an AR step's forward without a draft. Rounds interleave the buckets so
        that a slow moment of the machine hits them alike, and each bucket keeps its median round."""
        key = (self.drafter.name, self.buckets, self.cfg.dtype, self.cfg.batch_invariant, self.depth, self.cuda_graph)
        known = _COSTS.setdefault(self.model, {})
        if key not in known:
            steps = [functools.partial(self._calibration_step, b) for b in self.buckets]
            if self.cuda_graph:
                steps = [self._graphed(step) for step in steps]
            for step in steps:
                step()  # untimed: first-touch allocations and kernel selection stay out
            rounds = [[self._time(step) for step in steps] for _ in range(CALIBRATION_REPEATS)]
            known[key] = CostTable(self.buckets, [statistics.median(times) for times in zip(*rounds, strict=True)])
        return known[key]

    def _calibration_step(self, budget: int) -> None:
        tree = self.root_tree(self.root) if budget == 0 else truncate(self._draft_part()[0], budget)
        tokens, _, depths, _, _, visibility = tree
        self.model.forward(tokens, depths, visibility, self.cache, hidden_layers=self.hidden_layers,
                           batch_invariant=self.cfg.batch_invariant, float_logits=False)

    def _graphed(self, fn):
        """fn captured as a CUDA graph (after one eager run); returns its replay."""
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    def _time(self, fn) -> float:
        """Seconds of one run of fn: on a GPU the median of CALIBRATION_REPLAYS back-to-back runs timed by CUDA
        events (device time, as the decode's steps are timed, not the host's launch and wait); on the CPU one run."""
        self._sync()
        if self.model.device.type != "cuda":
            start = time.perf_counter()
            fn()
            return max(time.perf_counter() - start, 1e-9)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(CALIBRATION_REPLAYS)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        self._sync()
        return max(statistics.median(start.elapsed_time(end) for start, end in events) / 1e3, 1e-9)

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    # -- the step's device work --------------------------------------------------------------------
    def _draft_part(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
        """(the tree (MAX's shapes, the build limit's nodes), the draft, the prefix length before the step)."""
        prefix_len = self.cache.prefix_len.clone()
        with self.timer.range("draft"):
            draft = self.drafter.propose(self.root, self.num_generated)
        with self.timer.range("tree_build"):
            tree = ops.tree_build(draft, self.root, self.cfg.budget, self._limit)
        return tuple(tree), draft, prefix_len

    def _drafted_part(self) -> DraftedStep:
        """Draft, choose (on the device) and verify the chosen truncation: inside a graph capture a switch over every
        bucket's verify, eagerly the chosen one after reading its index. Bucket 0's branch verifies the smallest tree
        (so the calibration keeps learning), so the choice's index picks the branch as it is."""
        tree, draft, prefix_len = self._draft_part()
        choice = choose(tree, self._realised, self._predicted, self._bucket_index, self._cost)
        chosen = self._agreed(choice.chosen)
        branches = [functools.partial(self._verify_part, prefix_len, tree, draft, max(b, self.buckets[1]))
                    for b in self.buckets]
        if self._capture_pool is not None:
            outputs = graph_switch(chosen, branches, self._capture_pool, self._side)
        else:
            outputs = [None] * len(branches)
            i = int(chosen)
            outputs[i] = branches[i]()
        return DraftedStep(outputs, chosen, choice.expected, choice.value)

    def _verify_part(self, prefix_len: torch.Tensor, tree: tuple[torch.Tensor, ...], draft: torch.Tensor,
                     budget: int) -> _StepTensors:
        """Verify the drafted tree's truncation at budget and add what it showed to the drafter's calibration."""
        tree = truncate(tree, budget)
        out = self._verify_and_commit(prefix_len, tree, draft)
        _, parents, depths, ranks, scores, _ = tree
        learn_confidence(self._realised, self._predicted, parents, depths, ranks, scores, out.path)
        return out

    def _ar_part(self) -> _StepTensors:
        """An AR step without a draft: the root's verify, its hidden states kept for the drafter's next commit."""
        out, hidden = self._verify_and_accept(self.cache.prefix_len.clone(), self.root_tree(self.root), None)
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

    def _agreed(self, chosen: torch.Tensor) -> torch.Tensor:
        """Across the ranks of a parallel model, rank 0's choice (each rank's timings differ, and the ranks must
        verify the same tree), summed on the device; alone, the choice itself."""
        shard = self.model.shard
        if shard is None:
            return chosen
        agreed = chosen * (shard.rank == 0)
        shard.all_reduce(agreed)
        return agreed

    def _run(self, key: object, fn):
        """fn's outputs: from its captured graph where there is one, else run eagerly (and captured at the end of
        this step when CUDA graphs are on and the inputs it reads are a captured graph's static buffers)."""
        if key in self._graphs:
            self._graphs[key].replay()
            return self._graph_out[key]
        if self.cuda_graph and (key in ("draft", "ar") or "draft" in self._graphs):
            self._to_capture.append((key, fn))
        return fn()

    # -- the step's host part -----------------------------------------------------------------------
    def advance(self) -> _StepTensors | DraftedStep:
        """One step: an AR step without a draft while backing off, else (after telling the drafter of the back-off's
        tokens) the drafted step. Nothing is read back, except what earlier steps reported that is already there,
        and a wait when the host is MAX_IN_FLIGHT steps ahead. A drafted step returns its DraftedStep (which bucket's
        verify ran is on the device)."""
        self._read_reports(wait_for=len(self._in_flight) - MAX_IN_FLIGHT + 1)
        key = "ar" if self.ar_steps_left > 0 else "draft"
        as_decoded = not self.cuda_graph or key in self._graphs  # an eager run before the capture is no cost
        chosen = None
        if self.ar_steps_left > 0:
            self.ar_steps_left -= 1
            self.num_pending += 1
            start = self._in_flight.start()
            out = self._run(key, self._ar_part)
        else:
            if self.num_pending:
                self._run(("catch_up", self.num_pending), functools.partial(self._catch_up_part, self.num_pending))
                self.num_pending = 0
            self._in_flight.send_inputs(self.costs.predicted(), self._cost, self.build_limit(), self._limit)
            start = self._in_flight.start()
            out = self._run(key, self._drafted_part)
            chosen = out.chosen
        self._in_flight.finish(start, chosen, self.num_generated, as_decoded)
        if self._to_capture:
            self.capture_graph()
        return out

    def _read_reports(self, wait_for: int = 0) -> None:
        """Take in the reports of the launched steps that are done, waiting for the first wait_for of them: the
        bucket each verified, its time for the cost table, the back-off, the committed count."""
        for report in self._in_flight.read(wait_for):
            self.num_seen_generated = report.num_generated
            budget = self.buckets[max(report.chosen, 1)] if report.drafted else 0
            self.budget_counts[budget] += 1
            if report.as_decoded:  # an eager step before the capture would inflate its bucket's cost
                self.costs.observe(budget, report.seconds)
            if not report.drafted:
                continue
            self.recent_choices.append(self.buckets[report.chosen])
            if report.chosen > 0:
                self.track.backoff = 1
            elif self.ar_steps_left == 0:
                self.ar_steps_left = self.track.backoff
                self.track.backoff = min(2 * self.track.backoff, MAX_BACKOFF)

    def build_limit(self) -> int:
        """How many nodes the next drafted step builds: the smallest bucket at least twice the largest budget the
        last LIMIT_WINDOW drafted steps chose (at least the smallest tree), MAX before any choice. A tree built
        larger than the policy picks only costs its build; a choice that reaches the limit doubles the next one, so
        the limit follows the choices up as fast as they grow."""
        if not self.recent_choices:
            return self.cfg.budget
        wanted = max(2 * max(self.recent_choices), self.buckets[1])
        return next((b for b in self.buckets if b >= wanted), self.cfg.budget)

    @property
    def num_generated_at_most(self) -> int:
        """The committed count as far as the host knows without waiting: the last one read, plus L + 1 for every
        step in flight. A loop that must stop at a count waits (settle_timing) once this bound reaches it."""
        return self.num_seen_generated + len(self._in_flight) * (self.depth + 1)

    def settle_timing(self) -> None:
        """Wait for the steps in flight and take in their reports."""
        self._read_reports(wait_for=len(self._in_flight))

    @property
    def graph_captured(self) -> bool:
        return bool(self._graphs)

    def capture_graph(self) -> None:
        """Capture the parts that ran eagerly in this step (advance calls it; the base class's call after the first
        step finds nothing left to capture). With the drafted step's graph (its verify a switch over every bucket;
        the start-up calibration ran each shape) comes the AR step's, so that no later step runs a part eagerly the
        first time it chooses it; a catch-up's graph is captured after its first, eager run. Each graph is uploaded
        as it is captured (kernels/graph_upload.py), so that its first replay costs what every replay costs."""
        if self._to_capture and self._to_capture[0][0] == "draft" and "draft" not in self._graphs:
            self._to_capture = self._to_capture[:1] + [("ar", self._ar_part)]
        self._sync()  # the work in flight is the decode's: only the capture itself is counted in capture_s
        begun = time.perf_counter()
        timer, self.timer = self.timer, StepTimer(self.model.device, enabled=False)
        for key, fn in self._to_capture:
            if key not in self._graphs:
                graph = torch.cuda.CUDAGraph()
                self._capture_pool = torch.cuda.graph_pool_handle()
                try:
                    with torch.cuda.graph(graph, pool=self._capture_pool):
                        self._graph_out[key] = fn()
                finally:
                    self._capture_pool = None
                upload_graph(graph)
                self._graphs[key] = graph
        self._to_capture.clear()
        self.timer = timer
        self._sync()
        self.capture_s += time.perf_counter() - begun

    def step(self) -> StepRecord:
        record = super().step()
        self.settle_timing()
        return record

    def _record(self, st: _StepTensors | DraftedStep) -> StepRecord:
        """The step's record; a drafted step's from the verify that ran, with its decision, an AR step's with the
        last drafted step's curves."""
        if not isinstance(st, DraftedStep):
            record = super()._record(st)
            if self.last_choice is not None:
                record.budget = dataclasses.replace(self.last_choice, chosen=0, drafted=False)
            return record
        chosen = int(st.chosen)
        record = super()._record(st.verified(chosen))
        factors = log_confidence(self._realised, self._predicted).exp().tolist()
        record.budget = self.last_choice = BudgetChoice(
            chosen=self.buckets[chosen], drafted=True, buckets=list(self.buckets), expected=st.expected.tolist(),
            cost_s=self._cost.tolist(), value=st.value.tolist(), confidence=factors, built=int(self._limit))
        return record

