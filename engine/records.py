"""What a decode leaves behind: the one thing the dashboard, the reports and the tests read.

Records hold plain Python / numpy values (read off the device after each step), never live tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# What a run decoded with: "ar" (plain autoregressive), "chain" (the drafter's top-1 token per depth) or
# "ddtree" (the best-first tree).
MODES = ("ar", "chain", "ddtree")
TREES = {"tree": ("ddtree",), "chain": ("chain",), "both": ("chain", "ddtree")}  # which modes run beside AR
MODE_LABELS = {"ar": "AR", "chain": "chain", "ddtree": "DDTree"}


@dataclass(slots=True)
class NodeProbs:
    """Per node of a verified tree: the target's and the drafter's probabilities (engine/decoding/node_probs.py)."""

    target: list[float]  # p(i): the target's probability of node i's token given its ancestors (root: 1)
    draft: list[float]  # the drafter's marginal probability of node i's token at its depth (root: 1)
    move_on: list[float]  # the target's mass on node i's children: the chance the walk moves past node i
    expected_accepted: float  # sum over drafted nodes of P(i), the chance that node i is accepted
    draft_expected: float  # the drafter's surrogate: sum over drafted nodes of exp(cumulative draft log-prob)


@dataclass(slots=True)
class TreeRecord:
    """The drafted tree of one step. Node 0 is the root; nodes are in best-first pop order.

    Padding nodes (a budget larger than the tree the draft allows) have parent -1 and score -inf."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]  # rank of the node's token among its depth's draft candidates (root: 0)
    scores: list[float]  # cumulative draft log-probability (root: 0)
    visibility: np.ndarray  # [N, N] bool: node i sees node j iff j is i or an ancestor of i

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        return [c for c, p in enumerate(self.parents) if p == node and c != node]


@dataclass(slots=True)
class ExpertTraffic:
    """What one step's verify did to the routed experts (counted on the device inside the step, engine/model/moe.py)."""

    touched: list[int]  # per MoE layer: distinct routed experts the verify's nodes chose (AR: at most top-k)
    bytes_per_expert: int  # one routed expert's gate, up and down weights in the run's dtype

    @property
    def bytes_read(self) -> int:
        """Routed-expert weight bytes the verify had to read: touched experts (all layers) x bytes_per_expert."""
        return sum(self.touched) * self.bytes_per_expert


@dataclass(slots=True)
class BudgetChoice:
    """What `--budget auto` decided at one step (engine/decoding/budget.py): the budget buckets it chose among,
    the expected accepted drafted tokens and the predicted step seconds at each, their ratio (expected tokens per
    second), the confidence correction it applied per depth and rank class, and how large the tree was built
    (auto_budget.build_limit: about twice the recent choices, up to the largest bucket). drafted=False: an AR step taken
    without a draft (the policy backs off from a drafter whose trees do not pay); its curves are the last drafted
    step's."""

    chosen: int  # the best bucket; 0 starts a back-off, and that drafted step still verifies the smallest tree
    drafted: bool
    buckets: list[int]
    expected: list[float]  # 1 + expected accepted is the expected tokens the step commits
    cost_s: list[float]
    value: list[float]  # (1 + expected) / cost_s
    confidence: list[list[float]]  # realised / predicted acceptance per depth (0: the root) and rank class
    # ([the drafter's top token at its depth, the others])
    built: int  # the nodes past the root the tree was built with: the buckets above it see no more expected tokens


@dataclass(slots=True)
class StepRecord:
    """One decode step (AR: a tree of just the root)."""

    index: int
    mode: str  # one of MODES
    prefix_len: int  # cache rows before the step (= position of the root)
    tree: TreeRecord
    target: list[int]  # the target model's pick at each node (argmax, or its sample at temperature > 0)
    logit_gap: list[float]  # top-1 minus top-2 target logit at each node
    path: list[int]  # accepted node indices, root first
    bonus: int  # target argmax at the last accepted node: the step's last committed token
    committed: list[int]  # tokens this step committed: accepted drafted tokens + the bonus
    timings_ns: dict[str, int] = field(default_factory=dict)  # stage name -> elapsed ns (empty: timer off)
    wall_ns: int = 0  # host wall time of the step, reading its record included
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # (range name, start ns from step start, ns)
    probs: NodeProbs | None = None  # what the target and the drafter give each node (engine/decoding/node_probs.py)
    committed_text: str | None = None  # the committed tokens as text (None: the model has no tokenizer)
    experts: ExpertTraffic | None = None  # routed experts the verify touched (None: the target has no MoE layer)
    budget: BudgetChoice | None = None  # the auto budget's decision (None: a fixed budget, AR or the chain)

    @property
    def num_accepted(self) -> int:
        """Drafted tokens accepted (the bonus not counted)."""
        return len(self.path) - 1

    @property
    def num_committed(self) -> int:
        return len(self.committed)

    @property
    def step_ns(self) -> int:
        """Wall time of the whole step (the "step" range)."""
        return self.timings_ns["step"]


@dataclass(slots=True)
class RunRecord:
    """A whole decode: prefill, then steps until max_new_tokens are committed."""

    mode: str
    model: dict  # ModelConfig.to_dict()
    decode: dict  # DecodeConfig.to_dict()
    prompt: list[int]
    first_token: int  # the prefill's greedy token (the first root)
    steps: list[StepRecord]
    prefill_ns: int
    tokens: list[int]  # generated tokens, truncated to max_new_tokens
    logits: np.ndarray | None = None  # [num_generated, V] target logits per generated token (AR runs)
    wall_ns: int = 0  # prefill + every step's wall_ns
    drafter: dict = field(default_factory=dict)  # name and knobs of the drafter used
    prompt_text: str | None = None  # the prompt and the generated tokens as text (None: no tokenizer)
    text: str | None = None
    parallel: dict | None = None  # the tensor/expert-parallel layout it ran on (Shard.layout; None: one process)
    # token id -> (display piece, the bytes it stands for) of every id the run mentions (None: no tokenizer), so a
    # report read without the model still labels its tokens
    vocabulary: dict[int, tuple[str, bytes]] | None = None

    @property
    def num_committed(self) -> int:
        """Tokens produced before truncation: the prefill's token plus every step's."""
        return 1 + sum(s.num_committed for s in self.steps)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def token_ids(self) -> set[int]:
        """Every token id the run mentions: the prompt, the generated tokens, every step's tree, picks and commits."""
        ids = {*self.prompt, self.first_token, *self.tokens}
        for step in self.steps:
            ids.update(step.tree.tokens, step.target, step.committed, (step.bonus,))
        return ids
