"""report.html's opening, what a reader wants first: the verdicts and the headline numbers (tau with its tau on new
text and the text's distinct-4-gram rate, tokens/s, speedup with their spread, or the caveat that one run has none),
the prompt and the generated texts, then the acceptance and timing figures; the full configuration folds away at the
end (config_details)."""
from __future__ import annotations

from engine.config import DecodeConfig
from engine.drafters import REGISTRY, DrafterSpec
from engine.records import MODE_LABELS, RunRecord
from profiling.divergence import verdict
from profiling.html_parts import e, fmt, name_cell, table
from profiling.measurement import Measurement
from profiling.metrics import distinct_4gram_rate, num_dropped
from profiling.repeats import LARGE_SPREAD, relative_spread
from profiling.tau_text import NEW_TEXT_NOTE, summary_beside_tau

STATISTIC_NAMES = {"tokens_per_s": "tokens/s", "speedup": "speedup"}


def settings_line(data: Measurement) -> str:
    """One line of what was decoded, how and where: modes, drafter, B, block size, tokens, sampling, device."""
    runs, env = data.runs, data.environment
    spec = runs[data.primary]
    cfg = DecodeConfig(**spec.decode)
    drafter = spec.drafter
    name = drafter.get("name")
    if name in REGISTRY:
        drafter_text = DrafterSpec(name, **{f: drafter[f] for f in REGISTRY[name].fields if f in drafter}).label()
    else:
        drafter_text = str(name)
    modes = " and ".join(MODE_LABELS[m] for m in runs if m != "ar")
    commit = (env.get("git_commit") or "no git commit")[:12]
    return (f"{modes} vs AR · {drafter_text} drafter · B = {cfg.budget_label}, block size {cfg.block_size} · "
            f"{cfg.max_new_tokens} new tokens · {cfg.sampling} · {cfg.device} {cfg.dtype}"
            f"{' batch-invariant' if cfg.batch_invariant else ''} · on {env.get('device_name', cfg.device)}, "
            f"commit {commit}")


def _verdicts(summaries: dict[str, dict]) -> str:
    return "".join(
        f'<p><span class="ok">{e(s["exactness"])}: {MODE_LABELS[m]} emitted exactly the AR tokens</span></p>'
        if s["matches_ar"] else f'<p><span class="bad">Warning: the texts differ. {e(verdict(s, MODE_LABELS[m]))}. '
        'Its speedup is measured over different outputs.</span></p>' for m, s in summaries.items())


def _spread(s: dict, digits: str) -> str:
    if s["median"] is None or s["n"] < 2:
        return ""
    return f" (p10–p90 {s['p10']:{digits}}–{s['p90']:{digits}}, n {s['n']})"


def _card(big: str, what: str, detail: str) -> str:
    return (f'<div class="card"><div class="big">{e(big)}</div><div>{e(what)}</div>'
            f'<div class="what">{e(detail)}</div></div>')


def headline_section(data: Measurement) -> str:
    """The verdicts, then per run tau, its tau on new text (and how many steps), the distinct-4-gram rate of its
    tokens, tokens/s and the speedup over AR: medians of the repeats with their p10-p90 spread, or for one run the
    caveat that it has no spread."""
    summaries, repeats = data.summaries, data.repeats
    measured = repeats.modes
    cards, rows = [], []
    for mode in data.runs:
        label, row = MODE_LABELS[mode], measured[mode]
        tps, speedup = row["tokens_per_s"], row["speedup"]
        tau = 1.0 if mode == "ar" else summaries[mode]["tau"]
        summary = summaries.get(mode)
        new_text = "–" if summary is None else (f"{fmt(summary['new_text_tau'], 2)} ({summary['new_text_steps']} of "
                                                f"{summary['num_steps']})")
        distinct = distinct_4gram_rate([data.runs[mode]]) if summary is None else summary["distinct_4gram_rate"]
        different = mode != "ar" and not summaries[mode]["matches_ar"]
        speedup_text = "1 (the baseline)" if mode == "ar" else (
            "–" if speedup["median"] is None else f"{speedup['median']:.2f}x{_spread(speedup, '.2f')}"
            + (" * over different outputs" if different else ""))
        tps_text = "–" if tps["median"] is None else f"{tps['median']:.1f}{_spread(tps, '.1f')}"
        rows.append([name_cell(label), f"<td>{fmt(tau, 2)}</td>", f"<td>{e(new_text)}</td>",
                     f"<td>{fmt(distinct, 2)}</td>", f"<td>{e(tps_text)}</td>", f"<td>{e(speedup_text)}</td>"])
        if mode != "ar":
            cards.append(_card("–" if speedup["median"] is None else f"{speedup['median']:.2f}x",
                               f"{label}: speedup over AR{' (over different outputs)' if different else ''}",
                               f"tau {fmt(tau, 2)} tokens per step (the bonus included), "
                               f"{summary_beside_tau(summary)} · {tps_text} tokens/s"))
    if repeats.count > 1:
        how = e(f"Medians of {repeats.count} repeats after one warm-up, with their p10–p90 spread; the sections "
                "below show the median repeat's runs.")
    else:
        how = ("One run of each mode, after one warm-up: these numbers have no spread, and a single run can be far "
               "off on a busy machine. <code>python -m engine run --repeats R</code> (or the dashboard&#x27;s Profile "
               "page) measures R runs and gives medians with their spread.")
    warnings = "".join(
        f'<p class="bad">Large spread: {MODE_LABELS[mode]} {STATISTIC_NAMES[key]} varies by '
        f"{relative_spread(row[key]):.0%} of its median between p10 and p90 (more than {LARGE_SPREAD:.0%}): take more "
        "repeats or quiet the machine before trusting it.</p>"
        for mode, row in measured.items() for key in row["large_spread"])
    return (f"<h2>Headline</h2>{_verdicts(summaries)}<div class='cards'>{''.join(cards)}</div>"
            + table(["run", "tau (tokens/step)", "tau on new text (its steps of all)", "distinct-4", "tokens/s",
                     "speedup over AR"], rows)
            + f"<p class='note'>{e(NEW_TEXT_NOTE)}</p><p class='note spread'>{how}</p>{warnings}")


def _text_of(text: str | None, tokens: list[int]) -> str:
    return text if text is not None else " ".join(map(str, tokens))


def dropped_note(run: RunRecord) -> str:
    """What the last step verified past max_new_tokens and did not commit ('' when nothing)."""
    if not run.steps:
        return ""
    last, limit = run.steps[-1], int(run.decode["max_new_tokens"])
    dropped = num_dropped(run.steps, last.index, limit)
    if not dropped:
        return ""
    which = "its bonus token was" if dropped == 1 else f"its last {dropped} tokens, the bonus token among them, were"
    return (f"The last {MODE_LABELS[run.mode]} step (step {last.index}) accepted {last.num_accepted} drafted "
            f"token(s) plus its bonus token, but max_new_tokens = {limit} was reached first: {which} not committed "
            "(tau still counts them: it measures what a step accepted).")


def text_section(runs: dict[str, RunRecord]) -> str:
    """The prompt, then each run's generated text (decoded where the model has a tokenizer, else token ids); a
    speculative run with AR's exact tokens says so instead of repeating the text."""
    ar = runs["ar"]
    decoded = ar.text is not None
    how = ("Decoded with the model's tokenizer." if decoded else
           "The model has no tokenizer: the prompt and the generated tokens are shown as token ids.")
    parts = [f"<h2>Text</h2><p class='note'>{e(how)}</p><h3>Prompt ({len(ar.prompt)} tokens)</h3>"
             f"<pre class='text prompt-text'>{e(_text_of(ar.prompt_text, ar.prompt))}</pre>"]
    for mode, run in runs.items():
        label = MODE_LABELS[mode]
        if mode != "ar" and run.tokens == ar.tokens:
            parts.append(f"<p>{label}: the same {len(run.tokens)} tokens as AR, so the same text.</p>")
        else:
            parts.append(f"<h3>Generated by {label} ({len(run.tokens)} tokens)</h3>"
                         f"<pre class='text generated-text'>{e(_text_of(run.text, run.tokens))}</pre>")
        note = dropped_note(run) if mode != "ar" else ""
        parts.append(f"<p class='note dropped'>{e(note)}</p>" if note else "")
    return "".join(parts)


def timing_table(data: Measurement) -> str:
    """The shown runs side by side: tokens, steps, tree size, tau, tokens/s, speedup and times."""
    runs, summaries = data.runs, data.summaries
    header = ["metric", "AR", *(MODE_LABELS[m] for m in summaries)]
    first = next(iter(summaries.values()))

    def row(name: str, ar_value: object, values: list[object]) -> list[str]:
        return [name_cell(name), f"<td>{fmt(ar_value)}</td>", *(f"<td>{fmt(v)}</td>" for v in values)]

    def of(key: str) -> list[object]:
        return [s[key] for s in summaries.values()]

    nodes = [runs[m].steps[0].tree.num_nodes if runs[m].steps else None for m in summaries]
    exact = all(s["matches_ar"] for s in summaries.values())
    rows = [row("generated tokens", len(runs["ar"].tokens), of("num_generated")),
            row("steps", runs["ar"].num_steps, of("num_steps")), row("nodes verified per step", 1, nodes),
            row("tau (tokens/step, bonus incl.)", 1.0, of("tau")),
            row("tokens/s", first["ar_tokens_per_s"], of("tokens_per_s")),
            row("speedup" + ("" if exact else " (* over different outputs)"), None, of("speedup")),
            row("prefill ms", first["ar_prefill_ms"], of("prefill_ms")),
            row("time ms", first["ar_time_ms"], of("time_ms"))]
    return (table(header, rows) + "<p class='note'>tokens/s = generated tokens (the prefill's included) / host wall "
            "time of the prefill plus every step (each step's time includes reading its record back to the host).</p>")


def config_details(data: Measurement) -> str:
    """The model's and the decode's every setting, the drafter, the prompt's ids and the environment, folded."""
    spec = data.runs[data.primary]
    settings = {**spec.model, **spec.decode, "drafter": spec.drafter, "prompt (token ids)": spec.prompt}
    env_rows = [[name_cell(k), f"<td>{e(v)}</td>"] for k, v in data.environment.items()]
    setting_rows = [[name_cell(k), f"<td>{e(v)}</td>"] for k, v in settings.items()]
    return (f"<details><summary>Configuration: the model's and the decode's {len(settings)} settings, and where it "
            f"ran</summary>{table(['setting', 'value'], setting_rows)}{table(['environment', 'value'], env_rows)}"
            "</details>")
