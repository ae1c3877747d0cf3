"""Drafter health: the silent integration slips behind "acceptance lower than advertised", each measured on the
target and the prompt at hand and given a verdict (ok / warn) by a stated rule. Nothing here changes a token:
every decode it runs is greedy-exact whatever the drafter does; it changes only how many tokens a step accepts.

- target layers (vLLM #42704, an off-by-one in the layer index): tau with the configured target_layer_ids
  against the same drafter fed the ids shifted by -1 and by +1;
- mask embedding (SGLang #27924, a near-zero mask row): the norm of the target's embedding row of
  mask_token_id against the vocabulary's median row norm;
- RoPE (vLLM #56446, a YaRN amplitude that changed): the cos/sin tables the drafter built against the
  checkpoint's config, and whether the config leaves YaRN's amplitude to a rule that changed (then tau under
  both amplitudes);
- block size and target depth: the decode's against the checkpoint's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import DecodeConfig
from engine.decoding.decoder import Decoder
from engine.loaders.dflash_checkpoint import read_dflash_dir
from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_fit import block_size_note, check_fits, depth_note
from engine.model import dflash_reference as reference
from engine.model.rope import attention_factor, yarn_mscale
from engine.model.target import TargetModel

OK, WARN = "ok", "warn"
TAU_MARGIN = 0.02  # a shifted layer list "accepts more" when its tau exceeds the configured one's by this fraction
MASK_NORM_FLOOR = 0.1  # the mask row is "near zero" below this fraction of the median embedding row norm
ROPE_TOLERANCE = 1e-4  # relative: the drafter's amplitude and frequencies against the config's
SHIFTS = (-1, 1)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: str  # OK or WARN
    found: str  # what was measured, in words
    rule: str  # the rule the verdict follows
    values: dict  # the measured numbers (plain JSON values)


def _fmt(tau: float | None) -> str:
    return "n/a" if tau is None else f"{tau:.2f}"


def layer_check(cfg: DFlashConfig, num_target_layers: int, tau: float,
                tau_of: Callable[[DFlashConfig], float]) -> Check:
    """tau: the configured ids'; tau_of measures the ids shifted by -1 and +1 (a shift leaving the target's
    layers is n/a)."""
    taus: dict[int, float | None] = {0: tau}
    for shift in SHIFTS:
        ids = tuple(i + shift for i in cfg.target_layer_ids)
        ok = all(0 <= i < num_target_layers for i in ids)
        taus[shift] = tau_of(dataclasses.replace(cfg, target_layer_ids=ids, num_target_layers=num_target_layers)) \
            if ok else None
    return layer_verdict(cfg.target_layer_ids, taus)


def layer_verdict(ids: Sequence[int], taus: dict[int, float | None]) -> Check:
    """taus: shift (0 = as configured, -1, +1) -> tau, None where the shift leaves the target."""
    base = taus[0]
    better = [s for s in SHIFTS if taus.get(s) is not None and taus[s] > base * (1 + TAU_MARGIN)]
    found = f"tau {_fmt(base)} with {list(ids)}; " + "; ".join(f"{_fmt(taus.get(s))} with ids {s:+d}" for s in SHIFTS)
    if better:
        found += f": ids {better[0]:+d} accept more, the layer list may be off by one"
    return Check("target layers", WARN if better else OK, found,
                 f"warn when the ids shifted by -1 or +1 (vLLM #42704's off-by-one) reach more than "
                 f"{1 + TAU_MARGIN:.2f}x the configured ids' tau",
                 {"tau": {str(s): t for s, t in taus.items()}})


def mask_check(cfg: DFlashConfig, embed: torch.Tensor) -> Check:
    """The mask token's embedding row norm against the median row norm of the target's vocabulary."""
    norms = embed.float().norm(dim=1)
    mask_norm, median = float(norms[cfg.mask_token_id]), float(norms.median())
    ratio = mask_norm / median if median > 0 else 0.0
    return Check("mask embedding", WARN if ratio < MASK_NORM_FLOOR else OK,
                 f"|embed[{cfg.mask_token_id}]| = {mask_norm:.4g}, median row {median:.4g} (ratio {ratio:.3g})",
                 f"warn when the mask token's embedding row is below {MASK_NORM_FLOOR}x the median row norm "
                 "(SGLang #27924: a near-zero mask row carries no 'predict here' signal)",
                 {"mask_norm": mask_norm, "median_norm": median, "ratio": ratio})


def _amplitude_and_frequencies(cos: np.ndarray, sin: np.ndarray) -> tuple[float, np.ndarray]:
    """From tables of positions 0 and 1: the amplitude (cos at position 0) and the angle per position."""
    return float(cos[0, 0]), np.arctan2(sin[1], cos[1])


def legacy_amplitude(cfg: DFlashConfig) -> float | None:
    """YaRN's amplitude by the rule vLLM used before #56446 (mscale(factor), ignoring mscale / mscale_all_dim),
    where the config leaves it to the mscale pair and that rule gives another value than transformers'; else
    None (no ambiguity)."""
    rs = cfg.rope_scaling
    if rs is None or rs.get("attention_factor") is not None or not (rs.get("mscale") and rs.get("mscale_all_dim")):
        return None
    legacy = yarn_mscale(rs["factor"])
    return legacy if abs(legacy - attention_factor(rs)) > ROPE_TOLERANCE else None


def rope_check(cfg: DFlashConfig, cos: torch.Tensor, sin: torch.Tensor, tau: float,
               tau_of: Callable[[DFlashConfig], float] | None) -> Check:
    """cos, sin: the drafter's tables (positions 0 and 1 at least); tau: its tau; tau_of measures a variant of the
    config (used when the amplitude is ambiguous; None skips that decode)."""
    amp, freq = _amplitude_and_frequencies(cos[:2].double().cpu().numpy(), sin[:2].double().cpu().numpy())
    ref_amp, ref_freq = _amplitude_and_frequencies(*reference.rope_tables(cfg, 2))
    diffs = [f"amplitude {ref_amp:.4f}"] if abs(amp - ref_amp) > ROPE_TOLERANCE * ref_amp else []
    diffs += [] if np.allclose(freq, ref_freq, rtol=ROPE_TOLERANCE, atol=0) else ["other frequencies"]
    same = not diffs
    kind = "plain RoPE" if cfg.rope_scaling is None else f"YaRN factor {cfg.rope_scaling['factor']:g}"
    found = f"{kind}, base {cfg.rope_theta:g}, amplitude {amp:.4f}: " + (
        "the tables follow the config" if same else f"the config implies {' and '.join(diffs)}")
    values: dict = {"amplitude": amp, "config_amplitude": ref_amp, "tables_match": bool(same), "tau": tau}
    legacy = legacy_amplitude(cfg)
    if legacy is not None:
        values["legacy_amplitude"] = legacy
        found += (f"; the config sets mscale and mscale_all_dim but no attention_factor: transformers' rule gives "
                  f"{ref_amp:.4f}, vLLM's before #56446 {legacy:.4f}")
        if tau_of is not None:
            variant = dataclasses.replace(cfg, rope_scaling={**cfg.rope_scaling, "attention_factor": legacy})
            values["legacy_tau"] = tau_of(variant)
            found += (f" (tau {tau:.2f} with transformers' amplitude, {values['legacy_tau']:.2f} with vLLM's old "
                      "one)")
        found += "; set rope_scaling.attention_factor to pin it"
    return Check("RoPE", OK if same and legacy is None else WARN, found,
                 "warn when the drafter's cos/sin tables differ from the config's RoPE, or when the config leaves "
                 "YaRN's amplitude to the mscale / mscale_all_dim pair without attention_factor, a rule that "
                 "changed (vLLM #56446)", values)


def block_check(cfg: DFlashConfig, block_size: int) -> Check:
    note = block_size_note(cfg, block_size)
    return Check("block size", OK if note is None else WARN,
                 note or f"the decode's block size {block_size} is the checkpoint's",
                 "warn when the decode's block size differs from the checkpoint's: DFlash is trained at one",
                 {"decode": block_size, "checkpoint": cfg.block_size})


def depth_check(cfg: DFlashConfig, target_layers: int) -> Check:
    note = depth_note(cfg, target_layers)
    return Check("target depth", OK if note is None else WARN,
                 note or f"num_target_layers {cfg.num_target_layers} is the target's depth",
                 "warn when num_target_layers differs from the target's number of layers",
                 {"num_target_layers": cfg.num_target_layers, "target": target_layers})


def check_drafter(model: TargetModel, prompt: Sequence[int], decode: DecodeConfig, source: str,
                  mode: str = "ddtree") -> list[Check]:
    """Every check of the DFlash checkpoint at source against model, decoding prompt under decode in mode
    ("ddtree" or "chain") for each variant it measures. Raises DFlashLoadError where the drafter cannot run."""
    from engine.drafters.dflash import drafter_for

    ckpt = read_dflash_dir(source)
    cfg = ckpt.config
    check_fits(cfg, model.cfg, ckpt.source)

    def tau_with(drafter) -> float:
        run = Decoder(model, prompt, decode, mode, drafter).run()
        return sum(s.num_committed for s in run.steps) / max(run.num_steps, 1)

    def tau_of(variant: DFlashConfig) -> float:
        return tau_with(drafter_for(variant, ckpt.source, ckpt.identity, model, len(prompt), decode))

    drafter = drafter_for(cfg, ckpt.source, ckpt.identity, model, len(prompt), decode)
    tau = tau_with(drafter)
    layers = layer_check(cfg, model.cfg.num_hidden_layers, tau, tau_of)
    rope = rope_check(cfg, *drafter.model.rope, tau, tau_of)
    return [layers, mask_check(cfg, model.embed), rope, block_check(cfg, decode.block_size),
            depth_check(cfg, model.cfg.num_hidden_layers)]
