"""report.html as a reader meets it, parsed: it opens on the verdicts and the headline numbers (with their spread, or
the caveat that one run has none), then the prompt and the generated texts decoded with the model's tokenizer, the
configuration folded away in a <details>; every string from a file (tokenizer pieces, the texts) escaped; the last
step's tokens past max_new_tokens said to be not committed."""
from __future__ import annotations

import html.parser
import json
import random

import pytest
from hostile_model import HOSTILE, write_hostile_model
from test_exports import ExternalRefs

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import decode_runs
from engine.drafters import DrafterSpec
from engine.loaders.loading import load_model
from profiling import report
from profiling.measure import repeat_runs
from profiling.measurement import Measurement
from profiling.metrics import num_dropped
from profiling.repeats import median_repeat, repeat_stats


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny target whose BPE tokenizer learned HTML and markdown: its pieces hold <, >, & and ![x](...)."""
    root = write_hostile_model(tmp_path_factory.mktemp("hf") / "model")
    ckpt = load_model(root)
    assert any("<" in ckpt.tokenizer.piece(t) for t in ckpt.tokenizer.encode(HOSTILE))
    return ckpt


class Page(html.parser.HTMLParser):
    """The headings in order, the text of each <pre> by class, the text and title of every token chip, what lies
    inside <details>, and every tag seen outside plotly's scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.pres: list[tuple[str, str]] = []
        self.chips: list[tuple[str, str]] = []
        self.details_text = ""
        self.outside_details_text = ""
        self.tags: set[str] = set()
        self.first_table_after: str | None = None
        self._open: list[tuple[str, dict]] = []
        self._text: list[str] = []
        self._in_details = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "details":
            self._in_details = True
        if tag == "table" and self.first_table_after is None:
            self.first_table_after = self.headings[-1] if self.headings else "<before any heading>"
        self._open.append((tag, attrs))
        self._text.append("")

    def handle_endtag(self, tag):
        if tag == "details":
            self._in_details = False
        if not self._open or self._open[-1][0] != tag:
            return
        open_tag, attrs = self._open.pop()
        text = self._text.pop()
        if self._text:
            self._text[-1] += text
        if tag == "h2":
            self.headings.append(text)
        elif tag == "pre":
            self.pres.append((attrs.get("class", ""), text))
        elif tag == "span" and attrs.get("title", "").startswith("position "):
            self.chips.append((attrs["title"], text))

    def handle_data(self, data):
        if self._open and self._open[-1][0] == "script":
            return
        if self._text:
            self._text[-1] += data
        if self._in_details:
            self.details_text += data
        else:
            self.outside_details_text += data


def parsed(measurement: Measurement) -> tuple[str, Page]:
    page = report.render(measurement, "report.html").decode()
    parser = Page()
    parser.feed(page)
    refs = ExternalRefs()
    refs.feed(page)
    assert refs.refs == [] and "Plotly.newPlot" in page, "self-contained, plotly inlined"
    return page, parser


def test_the_report_leads_with_the_headline_and_the_texts_and_folds_the_configuration(model):
    block_size = random.randint(3, 5)
    max_new = 1 + 2 * block_size + random.randint(1, block_size - 1)  # the third step runs past max_new_tokens
    cfg = DecodeConfig(budget=random.randint(block_size, 16), block_size=block_size, max_new_tokens=max_new)
    prompt = model.tokenizer.encode(HOSTILE)
    runs = decode_runs(model, prompt, cfg, DrafterSpec(noise=0.0), ("chain", "ddtree"))
    page, p = parsed(Measurement.of(runs))

    assert p.headings[:3] == ["Headline", "Text", "Acceptance and timing"], p.headings
    assert p.first_table_after == "Headline", "the first table is the headline's, not the configuration"
    for mode, label in (("chain", "chain"), ("ddtree", "DDTree")):
        summary = Measurement.of(runs).summaries[mode]
        assert f"{label} emitted exactly the AR tokens" in p.outside_details_text
        assert f"{summary['tau']:.2f}" in p.outside_details_text and f"{summary['speedup']:.2f}x" in page
    assert "no spread" in p.outside_details_text and "--repeats R" in p.outside_details_text, "the one-run caveat"

    ar = runs["ar"]
    texts = dict((cls, text) for cls, text in reversed(p.pres))
    assert texts["text prompt-text"] == model.tokenizer.decode(prompt) == ar.prompt_text, "the prompt, decoded"
    assert texts["text generated-text"] == ar.text == model.tokenizer.decode(ar.tokens), "AR's text, decoded"
    assert "the same" in p.outside_details_text and "tokens as AR" in p.outside_details_text
    assert not {"img", "a"} & p.tags and HOSTILE.split("<b>")[0] not in page, "every string escaped"

    assert [text for _, text in p.chips] == [model.tokenizer.piece(t) for run in runs.values() for t in run.tokens]
    assert [title.split(" · ")[1] for title, _ in p.chips] == [f"id {t}" for run in runs.values() for t in run.tokens]

    for setting in ("vocab_size", "kv_lora_rank", "rope_theta", "prompt (token ids)"):
        assert setting in p.details_text and setting not in p.outside_details_text, setting
    assert page.count("<details>") == 1

    for mode, label in (("chain", "chain"), ("ddtree", "DDTree")):
        steps = runs[mode].steps
        dropped = num_dropped(steps, len(steps) - 1, max_new)
        assert dropped > 0
        which = ("its bonus token was" if dropped == 1 else
                 f"its last {dropped} tokens, the bonus token among them, were")
        assert (f"The last {label} step (step {len(steps) - 1}) accepted {steps[-1].num_accepted} drafted token(s) "
                f"plus its bonus token, but max_new_tokens = {max_new} was reached first: {which} not committed"
                ) in p.outside_details_text


def test_repeats_give_medians_with_their_spread_and_no_tokenizer_shows_ids(tiny_checkpoint):
    cfg = DecodeConfig(budget=random.randint(4, 12), block_size=4, max_new_tokens=9)
    count = random.randint(2, 3)
    repeated = repeat_runs(DecodeRequest(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg,
                                         DrafterSpec(noise=0.3), ("ddtree",)), count)
    runs = median_repeat(repeated, "ddtree")
    stats = repeat_stats(repeated)
    page, p = parsed(Measurement.of(runs, repeats=stats))
    speedup = stats.modes["ddtree"]["speedup"]
    assert (f"{speedup['median']:.2f}x (p10–p90 {speedup['p10']:.2f}–{speedup['p90']:.2f}, n {count})"
            in p.outside_details_text)
    assert f"Medians of {count} repeats" in p.outside_details_text and "no spread" not in p.outside_details_text
    texts = dict((cls, text) for cls, text in reversed(p.pres))
    assert texts["text prompt-text"] == " ".join(map(str, runs["ar"].prompt)), "no tokenizer: the ids"
    assert texts["text generated-text"] == " ".join(map(str, runs["ar"].tokens))
    assert [text for _, text in p.chips] == [str(t) for run in runs.values() for t in run.tokens]
    assert json.loads(report.render(Measurement.of(runs, repeats=stats), "report.json"))["repeats"]["count"] == count


def test_tree_figures_escape_pieces_and_name_the_dropped_bonus(model):
    from profiling import figures

    cfg = DecodeConfig(budget=8, block_size=3, max_new_tokens=1 + 3 + 1)
    runs = decode_runs(model, model.tokenizer.encode(HOSTILE), cfg, DrafterSpec(noise=0.0), ("ddtree",))
    steps = runs["ddtree"].steps
    last = steps[-1]
    dropped = num_dropped(steps, last.index, cfg.max_new_tokens)
    assert dropped == 2
    fig = figures.tree_figure(last, model.tokenizer.piece, dropped)
    assert "the last 2 not committed (max_new_tokens)" in fig.layout.title.text
    bonus = next(t for t in fig.data if t.name == "bonus")
    assert "not committed" in bonus.hovertext[0]
    labels = [text for t in fig.data if t.text is not None for text in t.text]
    assert labels and all("<" not in text for text in labels), "plotly reads tags in text: pieces escaped"
    assert "not committed" not in figures.tree_figure(steps[0], model.tokenizer.piece, 0).layout.title.text


def test_num_dropped_counts_only_the_tokens_past_max_new_tokens(tiny_checkpoint):
    cfg = DecodeConfig(budget=8, block_size=4, max_new_tokens=random.randint(2, 14))
    run = decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, DrafterSpec(noise=0.4), ("ddtree",))
    steps = run["ddtree"].steps
    dropped = [num_dropped(steps, i, cfg.max_new_tokens) for i in range(len(steps))]
    assert dropped[:-1] == [0] * (len(steps) - 1)
    assert 1 + sum(s.num_committed for s in steps) - dropped[-1] == cfg.max_new_tokens == len(run["ddtree"].tokens)
