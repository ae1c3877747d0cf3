"""What the schema cannot say about a report.json: the checks profiling/report_reader.py runs on a document that
already matches profiling/schema.py, before it builds a record from it.

Each check is a rule the engine's own records always keep (engine/records.py, README "One DDTree step"): ids
within the vocabulary and the tree, parents before children, the visibility mask the ancestor closure, the path
following parent links, every committed token the target's pick along it, each step's prefix where the previous
one left it, and a run's tokens what its steps committed. A file that breaks one was damaged or edited; the
first broken rule raises ReportCheckError naming the place in the file and what it holds.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.config import ConfigError, DecodeConfig, ModelConfig, buckets_up_to
from engine.loaders.text import render_bytes
from engine.records import MODES
from profiling import report_trees
from profiling.repeats import RANGE_COLUMNS, STAT_FIELDS

if TYPE_CHECKING:
    from engine.drafters import DrafterSpec

LATER_DECODE_FIELDS = {"auto_budget"}  # added after schema 2's first reports: absent there, their default applies


class ReportCheckError(ValueError):
    """A rule of the records broken in the document: the message starts with the place, e.g. steps[3].path[1]."""


def require(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ReportCheckError(f"{where}: {what}")


def check_ids(ids: Sequence[int], size: int, where: str, what: str = "token id") -> None:
    if not ids or (min(ids) >= 0 and max(ids) < size):
        return
    for i, x in enumerate(ids):
        require(0 <= x < size, f"{where}[{i}]", f"{what} {x} is out of range [0, {size})")


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """The document's config, checked: what the other checks measure against."""

    model: ModelConfig
    decode: DecodeConfig
    drafter: DrafterSpec
    modes: list[str]  # AR first, then the speculative modes in MODES order


def check_config(doc: dict) -> Config:
    from engine.drafters import REGISTRY, DrafterSpec  # the drafters load torch: only a document's drafter needs them

    config = doc["config"]
    try:
        model = ModelConfig.from_dict(config["model"])
    except (ConfigError, TypeError) as exc:
        raise ReportCheckError(f"config.model: {exc}") from None
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    given = set(config["decode"])
    require(given <= fields and fields - given <= LATER_DECODE_FIELDS, "config.decode",
            f"has fields {sorted(given)}, a decode config {sorted(fields)}")
    try:
        decode = DecodeConfig(**config["decode"])
    except (ConfigError, TypeError) as exc:
        raise ReportCheckError(f"config.decode: {exc}") from None
    drafter = config["drafter"]
    entry = REGISTRY.get(drafter.get("name"))
    require(entry is not None, "config.drafter.name", f"{drafter.get('name')!r} is not a drafter this dashboard knows "
                                                      f"({', '.join(REGISTRY)})")
    missing = [f for f in entry.fields if f not in drafter]
    require(not missing, "config.drafter", f"the {drafter['name']} drafter's {', '.join(missing)} is missing")
    try:
        spec = DrafterSpec(drafter["name"], **{f: drafter[f] for f in entry.fields})
    except (ConfigError, TypeError) as exc:
        raise ReportCheckError(f"config.drafter: {exc}") from None
    modes = config["modes"]
    expected = ["ar", *(m for m in MODES if m in modes and m != "ar")]
    require(modes == expected and len(modes) >= 2, "config.modes",
            f"{modes} is not AR followed by the speculative modes in the order {list(MODES)}")
    require(set(doc["runs"]) == set(modes), "runs", f"holds {sorted(doc['runs'])}, config.modes says {modes}")
    require(set(doc["summaries"]) == set(modes[1:]), "summaries",
            f"holds {sorted(doc['summaries'])}, config.modes says {modes[1:]}")
    primary = "ddtree" if "ddtree" in modes else modes[-1]
    require(doc["primary"] == primary, "primary", f"{doc['primary']!r}, but the report's headline run is {primary!r}")
    require(len(config["prompt"]) >= 1, "config.prompt", "is empty: a decode starts from at least one token")
    check_ids(config["prompt"], model.vocab_size, "config.prompt")
    return Config(model, decode, spec, modes)


def tree_size(mode: str, decode: DecodeConfig) -> int:
    """Nodes in every tree of a mode: AR's root alone, the chain's root + L, DDTree's root + B (padding included)."""
    return {"ar": 1, "chain": decode.block_size, "ddtree": decode.budget + 1}[mode]


def check_tree(tree: dict, size: int, max_depth: int, vocab: int, where: str) -> np.ndarray:
    """The tree's rules, walked node by node only where report_trees finds one broken; returns its visibility
    mask [size, size] bool, which its `visible` rows hold as index lists."""
    lengths = {k: len(tree[k]) for k in ("tokens", "parents", "depths", "ranks", "scores", "visible")}
    require(set(lengths.values()) == {size}, f"{where}.tree", f"the arrays' lengths {lengths} are not all {size}, "
                                                              "the tree size of this mode and budget")
    mask = report_trees.mask_if_valid(tree, size, max_depth, vocab)
    if mask is None:
        _walk_tree(tree, size, max_depth, vocab, where)
        mask = report_trees.mask_of_rows(tree["visible"])
    return mask


def _walk_tree(tree: dict, size: int, max_depth: int, vocab: int, where: str) -> None:
    check_ids(tree["tokens"], vocab, f"{where}.tree.tokens")
    parents, depths = tree["parents"], tree["depths"]
    require(parents[0] == -1 and depths[0] == 0, f"{where}.tree", "node 0 is the root: parent -1, depth 0")
    for i in range(1, size):
        p, at = parents[i], f"{where}.tree.parents[{i}]"
        if p == -1:  # padding: depth 0, score -inf (null)
            require(depths[i] == 0 and tree["scores"][i] is None, at, "a padding node (parent -1) has depth 0 and a "
                                                                      "null score")
            continue
        require(0 <= p < i, at, f"parent {p} does not precede node {i} (nodes are in pop order)")
        require(depths[i] == depths[p] + 1, f"{where}.tree.depths[{i}]", f"depth {depths[i]} is not its parent's "
                                                                          f"{depths[p]} + 1")
        require(depths[i] <= max_depth, f"{where}.tree.depths[{i}]", f"depth {depths[i]} exceeds the block's "
                                                                      f"{max_depth} drafted positions")
    require(min(tree["ranks"]) >= 0, f"{where}.tree.ranks", "a rank is negative")
    for i, row in enumerate(tree["visible"]):
        sees, node = {i}, parents[i]
        while node >= 0:
            sees.add(node)
            node = parents[node]
        require(row == sorted(sees), f"{where}.tree.visible[{i}]", f"{row[:8]} is not node {i} and its ancestors "
                                                                   f"{sorted(sees)}")


def check_step(step: dict, index: int, prefix_len: int, cfg: Config, where: str) -> np.ndarray:
    """One step against its mode's tree size and the acceptance rule; prefix_len: where the previous step left.
    Returns its tree's visibility mask."""
    decode, vocab = cfg.decode, cfg.model.vocab_size
    size = tree_size(step["mode"], decode)
    if step["mode"] == "ddtree" and decode.auto_budget:  # each step verifies a truncation at a budget bucket
        size = len(step["tree"]["tokens"])
        require(size - 1 in buckets_up_to(decode.budget), f"{where}.tree",
                f"has {size} nodes; an auto-budget step verifies 1 + one of {buckets_up_to(decode.budget)}")
        choice = step.get("budget")
        require(choice is not None, f"{where}.budget", "is missing: an auto-budget step records its choice")
        lengths = {len(choice[k]) for k in ("expected", "cost_s", "value")}
        require(lengths == {len(choice["buckets"])} and choice["chosen"] in choice["buckets"], f"{where}.budget",
                "its curves do not cover its buckets, or it chose a bucket it does not list")
    require(step["index"] == index, f"{where}.index", f"{step['index']}, but it is {step['mode']} step {index}")
    require(step["prefix_len"] == prefix_len, f"{where}.prefix_len",
            f"{step['prefix_len']}, but the prompt and the steps before it leave the cache at {prefix_len}")
    mask = check_tree(step["tree"], size, decode.num_draft_positions, vocab, where)
    tree = step["tree"]
    for name in ("target", "logit_gap"):
        require(len(step[name]) == size, f"{where}.{name}", f"has {len(step[name])} entries for {size} nodes")
    check_ids(step["target"], vocab, f"{where}.target")
    path = step["path"]
    require(1 <= len(path) <= decode.block_size and path[0] == 0, f"{where}.path",
            f"{path[:8]} is not a path from the root (node 0) of at most {decode.block_size} nodes")
    check_ids(path, size, f"{where}.path", "node")
    for k in range(1, len(path)):
        require(tree["parents"][path[k]] == path[k - 1], f"{where}.path[{k}]",
                f"node {path[k]}'s parent is {tree['parents'][path[k]]}, not the path's node {path[k - 1]}")
    committed = step["committed"]
    picks = [step["target"][n] for n in path]
    require(committed == picks, f"{where}.committed", f"{committed[:8]} is not the target's picks along the path "
                                                      f"{picks[:8]}")
    drafted = [tree["tokens"][n] for n in path[1:]]
    require(picks[:-1] == drafted, f"{where}.path", "an accepted node's token is not the target's pick at its parent")
    require(step["bonus"] == committed[-1], f"{where}.bonus", f"{step['bonus']} is not the last committed token "
                                                              f"{committed[-1]}")
    require(step["num_accepted"] == len(path) - 1 and step["num_committed"] == len(committed), where,
            "num_accepted / num_committed do not match the path and the committed tokens")
    require(step["wall_ns"] >= 0 and min(step["timings_ns"].values(), default=0) >= 0, where, "a time is negative")
    require(all(s >= 0 and d >= 0 for _, s, d in step["spans"] or []), f"{where}.spans", "a span is negative")
    if step["probs"] is not None:
        for name in ("target", "draft", "move_on"):
            require(len(step["probs"][name]) == size, f"{where}.probs.{name}", f"has {len(step['probs'][name])} "
                                                                               f"entries for {size} nodes")
    experts = step.get("experts")
    if experts is not None:
        layers = cfg.model.num_hidden_layers - cfg.model.first_k_dense_replace
        require(len(experts["touched"]) == layers, f"{where}.experts.touched",
                f"has {len(experts['touched'])} entries for the model's {layers} MoE layers")
        require(experts["bytes_read"] == sum(experts["touched"]) * experts["bytes_per_expert"],
                f"{where}.experts.bytes_read", "is not touched (all layers) x bytes_per_expert")
    return mask


def check_steps_and_runs(doc: dict, cfg: Config, progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Every step in its run's order, each where the one before left the cache; each run's tokens are what its
    steps committed, truncated to max_new_tokens. Returns each step's visibility mask, in the file's order;
    progress(i): called every so many steps with the steps checked."""
    prompt_len, limit = len(doc["config"]["prompt"]), cfg.decode.max_new_tokens
    by_mode: dict[str, list[dict]] = {m: [] for m in cfg.modes}
    prefix = dict.fromkeys(cfg.modes, prompt_len)
    masks = []
    for i, step in enumerate(doc["steps"]):
        require(step["mode"] in by_mode, f"steps[{i}].mode", f"{step['mode']!r} is not one of config.modes "
                                                             f"{cfg.modes}")
        done = by_mode[step["mode"]]
        masks.append(check_step(step, len(done), prefix[step["mode"]], cfg, f"steps[{i}]"))
        prefix[step["mode"]] += step["num_committed"]
        done.append(step)
        if progress is not None and i % 64 == 0:
            progress(i)
    for mode, steps in by_mode.items():
        run, where = doc["runs"][mode], f"runs.{mode}"
        require(run["mode"] == mode, f"{where}.mode", f"{run['mode']!r} under {mode!r}")
        require(run["num_steps"] == len(steps), f"{where}.num_steps", f"{run['num_steps']}, but the file holds "
                                                                      f"{len(steps)} {mode} steps")
        check_ids([run["first_token"]], cfg.model.vocab_size, f"{where}.first_token")
        generated = [run["first_token"]] + [t for s in steps for t in s["committed"]]
        require(run["tokens"] == generated[:limit], f"{where}.tokens",
                f"are not the first token and the steps' committed tokens, cut to max_new_tokens {limit}")
        require(run["prefill_ns"] >= 0 and run["wall_ns"] == run["prefill_ns"] + sum(s["wall_ns"] for s in steps),
                f"{where}.wall_ns", "is not the prefill's time plus every step's")
    return masks


def check_capture(doc: dict, cfg: Config) -> None:
    """The capture's runs are the report's, its kernels in their run's steps, no time negative."""
    capture = doc["capture"]
    if capture is None:
        return
    for mode, run in capture["runs"].items():
        where = f"capture.runs.{mode}"
        require(mode in cfg.modes, where, f"{mode!r} is not one of config.modes {cfg.modes}")
        num_steps = doc["runs"][mode]["num_steps"]
        for i, k in enumerate(run["kernels"]):
            require(k["step"] is None or 0 <= k["step"] < num_steps, f"{where}.kernels[{i}].step",
                    f"{k['step']} is not one of the run's {num_steps} steps")
            require(k["start_ns"] >= 0 and k["dur_ns"] >= 0, f"{where}.kernels[{i}]", "a time is negative")
        for part in ("ranges", "ops"):
            for i, r in enumerate(run[part]):
                require(r["count"] >= 0 and r["cpu_ms"] >= 0 and r["device_ms"] >= 0, f"{where}.{part}[{i}]",
                        "a count or a time is negative")


def _piece(recorded: str, data: bytes) -> tuple[str, bytes]:
    """(piece, bytes) with the piece recomputed from the bytes (engine.loaders.text.render_bytes), as the live
    tokenizer shows it; a special token's recorded text is kept only where it is exactly its bytes."""
    special = recorded.encode("utf-8", "surrogatepass") == data
    return (recorded if special else render_bytes(data)), data


def check_vocabulary(doc: dict, cfg: Config, mentioned: set[int]) -> dict[int, tuple[str, bytes]] | None:
    """The vocabulary table as ids -> (piece, bytes), covering every id the runs mention (None: no tokenizer)."""
    table = doc.get("vocabulary")
    if table is None:
        return None
    out = {int(key): _piece(entry["piece"], bytes.fromhex(entry["bytes"])) for key, entry in table.items()}
    check_ids(sorted(out), cfg.model.vocab_size, "vocabulary", "key")
    missing = sorted(mentioned - set(out))
    require(not missing, "vocabulary", f"lacks token id(s) {missing[:8]} that the runs mention")
    return out


def check_stats(s: dict, count: int, where: str) -> None:
    """One {median, p10, p90, min, max, n}: ordered, n at most the repeats."""
    require(s["n"] <= count, f"{where}.n", f"{s['n']} values from {count} repeats")
    values = [s[k] for k in ("min", "p10", "median", "p90", "max")]
    if s["n"] == 0:
        require(all(v is None for v in values), where, "n is 0 but it holds values")
        return
    require(None not in values, where, f"n is {s['n']} but a value is null")
    require(all(a <= b or math.isclose(a, b, rel_tol=1e-9) for a, b in itertools.pairwise(values)), where,
            f"min <= p10 <= median <= p90 <= max does not hold: {values}")


def range_stat_rows(doc: dict, count: int, modes: list[str]) -> dict[str, dict[str, dict]]:
    """Per mode and range, the kernel rows' spread of mean_ms over the repeats (RANGE_COLUMNS), checked."""
    out: dict[str, dict[str, dict]] = {m: {} for m in modes}
    for i, row in enumerate(doc["kernels"]):
        where = f"kernels[{i}]"
        require(row["mode"] in out, f"{where}.mode", f"{row['mode']!r} is not one of config.modes {modes}")
        missing = [c for c in RANGE_COLUMNS if c not in row]
        require(not missing, where, f"lacks {', '.join(missing)}, which a report with repeat statistics carries")
        stats = {k: row[c] for k, c in zip(STAT_FIELDS, RANGE_COLUMNS, strict=True)}
        check_stats(stats, count, where)
        out[row["mode"]][row["name"]] = stats
    return out
