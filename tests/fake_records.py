"""Consistent synthetic RunRecords for exporter tests: random trees, accepted paths and nested timings.

A DDTree step's tree holds a chain of accepted nodes at random pop positions (each chain node's token is
the true next token); every other child of a chain node avoids the true token at its depth, so greedy
acceptance follows exactly the chain. Timings are built as real nested intervals (a parent = its children
plus some self time), in completion order like StepTimer.results_ns().
"""
from __future__ import annotations

import numpy as np

from engine.config import DecodeConfig
from engine.records import RunRecord, StepRecord, TreeRecord

MODEL = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2}


def stage_tree(mode: str, num_layers: int) -> list[tuple[str, list]]:
    """(name, children) of one step's ranges, in the order they run."""
    verify = [("embed", [])]
    for i in range(num_layers):
        verify += [(f"layer{i}/attn", [("verify_attn", [])]), (f"layer{i}/mlp", [])]
    verify += [("lm_head", [])]
    drafted = mode != "ar"
    stages = [("draft", []), ("tree_build", [])] if drafted else []
    stages += [("verify", verify), ("tree_accept", []), ("kv_compact", []), ("commit", [])]
    stages += [("draft_update", [])] if drafted else []
    return [("step", stages)]


def fake_timings(rng: np.random.Generator, mode: str, num_layers: int) -> dict[str, int]:
    """Per-range ns in completion order (children before parents), each parent >= the sum of its children."""
    out: dict[str, int] = {}

    def visit(prefix: str, nodes: list) -> int:
        total = 0
        for name, children in nodes:
            full = f"{prefix}/{name}" if prefix else name
            ns = visit(full, children) + int(rng.integers(1_000, 50_000))
            out[full] = ns
            total += ns
        return total

    visit("", stage_tree(mode, num_layers))
    return out


def fake_tree(rng: np.random.Generator, truth: list[int], root: int, num_accept: int, budget: int, depth: int,
              vocab: int, num_padding: int) -> tuple[TreeRecord, list[int], list[int]]:
    """A tree whose greedy acceptance follows a chain of num_accept nodes; returns it, its targets and the
    accepted path.

    truth[j] is the true token j + 1 positions after the root."""
    num_real = budget - num_padding
    chain = sorted(rng.choice(np.arange(1, num_real + 1), size=num_accept, replace=False).tolist())
    tokens, parents, depths, ranks, scores = [root], [-1], [0], [0], [0.0]
    on_chain = {0: 0}  # node -> chain position (root: 0)
    for node in range(1, num_real + 1):
        if node in chain:
            j = chain.index(node) + 1
            parent = 0 if j == 1 else chain[j - 2]
            token = truth[j - 1]
            on_chain[node] = j
        else:
            parent = int(rng.choice([n for n in range(node) if depths[n] < depth]))
            banned = {tokens[c] for c in range(1, node) if parents[c] == parent}
            if parent in on_chain:
                banned.add(truth[depths[parent]])
            token = int(rng.choice([t for t in range(vocab) if t not in banned]))
        siblings = [c for c in range(1, node) if parents[c] == parent]
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        ranks.append(len(siblings))
        scores.append(scores[parent] + float(np.log(rng.uniform(0.05, 1.0))))
    for _ in range(num_padding):
        tokens.append(root)
        parents.append(-1)
        depths.append(0)
        ranks.append(0)
        scores.append(float("-inf"))
    n = len(tokens)
    visibility = np.eye(n, dtype=bool)
    for i in range(1, num_real + 1):
        j = parents[i]
        while j >= 0:
            visibility[i, j] = True
            j = parents[j]
    target = [int(rng.integers(vocab)) for _ in range(n)]
    for node, j in on_chain.items():
        target[node] = truth[j]
    tree = TreeRecord(tokens=tokens, parents=parents, depths=depths, ranks=ranks, scores=scores,
                      visibility=visibility)
    return tree, target, [0, *chain]


def make_step(rng, index, mode, prefix_len, tree, target, path, num_layers) -> StepRecord:
    timings = fake_timings(rng, mode, num_layers)
    committed = [target[n] for n in path]
    return StepRecord(index=index, mode=mode, prefix_len=prefix_len, tree=tree, target=target,
                      logit_gap=rng.uniform(0.0, 5.0, size=len(target)).tolist(), path=path, bonus=committed[-1],
                      committed=committed, timings_ns=timings, wall_ns=timings["step"] + int(rng.integers(0, 30_000)))


def make_run(rng, mode, truth, prompt, cfg: DecodeConfig, num_layers, steps: list[StepRecord],
             logits=None, drafter=None) -> RunRecord:
    prefill_ns = int(rng.integers(100_000, 900_000))
    return RunRecord(mode=mode, model=dict(MODEL, num_hidden_layers=num_layers), decode=cfg.to_dict(),
                     prompt=list(prompt), first_token=truth[0], steps=steps, prefill_ns=prefill_ns,
                     tokens=truth[:cfg.max_new_tokens], logits=logits,
                     wall_ns=prefill_ns + sum(s.wall_ns for s in steps), drafter=drafter or {})


def fake_runs(seed: int, budget: int = 12, block_size: int = 5, max_new: int = 17, diverge_at: int | None = None,
              num_layers: int = 2, vocab: int = 50, mode: str = "ddtree") -> dict[str, RunRecord]:
    """An AR run and a speculative run (mode "ddtree" or "chain": a chain is a tree of budget L) of one prompt,
    by mode. diverge_at: the speculative tokens leave the AR ones there."""
    if mode == "chain":
        budget = block_size - 1
    rng = np.random.default_rng(seed)
    cfg = DecodeConfig(budget=budget, block_size=block_size, max_new_tokens=max_new, batch_invariant=False)  # fast mode
    depth = block_size - 1
    prompt = rng.integers(vocab, size=int(rng.integers(1, 6))).tolist()
    ar_truth = rng.integers(vocab, size=max_new + block_size + 1).tolist()
    dd_truth = list(ar_truth)
    if diverge_at is not None:
        dd_truth[diverge_at:] = [(t + 1 + int(rng.integers(vocab - 1))) % vocab for t in ar_truth[diverge_at:]]
        dd_truth[diverge_at] = (ar_truth[diverge_at] + 1) % vocab

    logits = rng.normal(size=(max_new, vocab))
    for i, t in enumerate(ar_truth[:max_new]):
        logits[i, t] = logits[i].max() + rng.uniform(0.01, 3.0)
    ar_steps = []
    for k in range(max_new - 1):
        tree, target, path = fake_tree(rng, ar_truth[k + 1:], ar_truth[k], 0, 0, 0, vocab, 0)
        ar_steps.append(make_step(rng, k, "ar", len(prompt) + k, tree, target, path, num_layers))
    ar = make_run(rng, "ar", ar_truth, prompt, cfg, num_layers, ar_steps, logits)

    dd_steps = []
    generated = 1
    while generated < max_new:
        num_accept = int(rng.integers(0, min(depth, budget) + 1))
        num_padding = int(rng.integers(0, budget - num_accept + 1)) if rng.uniform() < 0.3 else 0
        tree, target, path = fake_tree(rng, dd_truth[generated:], dd_truth[generated - 1], num_accept, budget,
                                       depth, vocab, num_padding)
        dd_steps.append(make_step(rng, len(dd_steps), mode, len(prompt) + generated - 1, tree, target, path,
                                  num_layers))
        generated += len(path)
    dd = make_run(rng, mode, dd_truth, prompt, cfg, num_layers, dd_steps,
                  drafter={"name": "oracle", "noise": 0.2, "seed": seed})
    return {"ar": ar, mode: dd}

