"""What the Compare, Report and Decode pages say in words (AppTest): Compare shows a tokenizer's text and pieces (ids
beside them), every string from the model's files escaped; the Report page says what it measured in this tab; the
last step's tokens past max_new_tokens are said to be not committed, live and in a recording."""
from __future__ import annotations

import html
import html.parser
import json
import random
import re

import pytest
from hostile_model import HOSTILE, write_hostile_model
from markdown_it import MarkdownIt
from recordings import record
from test_app import measure, metric, press, run, start

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from engine.loaders.loading import load_model
from profiling.metrics import num_dropped

OUR_TAGS = {"div", "span", "b", "pre"}  # what profiling.token_diff and ui.views.text_html write


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory):
    """A tiny target whose tokenizer learned HTML and markdown, prompted with them (prompts.json)."""
    root = write_hostile_model(tmp_path_factory.mktemp("hf") / "model")
    (root / "prompts.json").write_text(json.dumps({"prompts": [{"text": HOSTILE}]}))
    return root


class Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.chips: list[tuple[str, str]] = []
        self._chip: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        title = dict(attrs).get("title") or ""
        self._chip = title if tag == "span" and title.startswith("position ") else None

    def handle_data(self, data):
        if self._chip is not None:
            self.chips.append((self._chip, data))
            self._chip = None


def tags_of(fragment: str) -> Tags:
    parser = Tags()
    parser.feed(fragment)
    return parser


def markdown_values(at) -> list[str]:
    return [el.value for kind in ("markdown", "caption", "success", "warning", "error", "info")
            for el in getattr(at, kind)]


def test_compare_shows_the_text_and_pieces_with_ids_every_string_escaped(hostile_dir):
    piece = load_model(hostile_dir).tokenizer.piece
    at = start()
    at.sidebar.text_input(key="model_path").set_value(str(hostile_dir)).run()
    assert at.sidebar.text_area(key="prompt_box").value == HOSTILE
    run(at.switch_page("app_pages/compare.py"))
    runs = at.session_state["live"].measurement.runs
    ar, dd = runs["ar"], runs["ddtree"]

    table = at.dataframe[0].value
    assert list(table["AR"]) == [piece(t) for t in ar.tokens] and list(table["AR id"]) == ar.tokens
    assert list(table["DDTree"]) == [piece(t) for t in dd.tokens] and list(table["DDTree id"]) == dd.tokens
    assert list(table.columns[:5]) == ["position", "AR", "DDTree", "equal", "AR id"], "text first, ids beside"

    fragments = [el.value for el in at.html]
    for fragment in fragments:
        assert tags_of(fragment).tags <= OUR_TAGS, fragment[:300]
    text = next(f for f in fragments if f.startswith("<pre"))
    assert html.unescape(re.sub(r"<[^>]+>", "", text)) == HOSTILE + ar.text, "the prompt, then AR's text"
    chips = tags_of(next(f for f in fragments if "token-diff" in f)).chips
    shown = [(i, t) for run_ in (ar, dd) for i, t in enumerate(run_.tokens)]
    assert [c[1] for c in chips] == [piece(t) for _, t in shown], "every generated token as its piece"
    assert [c[0].split(" · ")[:2] for c in chips] == [[f"position {i}", f"id {t}"] for i, t in shown]
    assert any(f"the same {len(ar.tokens)} tokens as AR" in v for v in markdown_values(at))

    md = MarkdownIt("commonmark")
    for value in markdown_values(at):
        assert not re.search(r"<(img|a|script)\b", md.render(value)), value


def test_compare_names_the_pieces_at_a_first_divergence(hostile_dir):
    from profiling.measurement import Measurement

    piece = load_model(hostile_dir).tokenizer.piece
    at = start()
    at.sidebar.text_input(key="model_path").set_value(str(hostile_dir)).run()
    run(at.switch_page("app_pages/compare.py"))
    live = at.session_state["live"]
    runs = live.measurement.runs
    dd = runs["ddtree"]
    position = random.randrange(1, len(dd.tokens))
    ar_token = runs["ar"].tokens[position]
    dd.tokens[position] = (ar_token + 1) % runs["ar"].model["vocab_size"]
    live.measurement = Measurement.of(runs, repeats=live.measurement.repeats)
    run(at)
    caption = next(v for v in markdown_values(at) if v.startswith("AR's token there"))
    assert f"{ar_token} " in caption and f"DDTree's: {dd.tokens[position]} " in caption
    rendered = MarkdownIt("commonmark").render(caption)
    codes = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", rendered)]
    assert codes == [piece(ar_token), piece(dd.tokens[position])], "the pieces, literally"
    chips = tags_of(next(el.value for el in at.html if "token-diff" in el.value)).chips
    assert f"AR: id {ar_token}" in chips[len(runs["ar"].tokens) + position][0], "the differing chip names AR's"


def test_the_report_page_says_how_many_repeats_it_measured_in_this_tab():
    at = start()
    run(at.switch_page("app_pages/report.py"))
    captions = [c.value for c in at.caption]
    assert any("measured in this tab: 1 repeat(s)" in c and "no spread" in c for c in captions), captions
    assert not any("Profile page's repeat statistics" in c for c in captions), "a tab that never opened Profile"

    at.session_state["profile_repeats"] = 2
    measure(run(at.switch_page("app_pages/profile.py")))
    run(at.switch_page("app_pages/report.py"))
    captions = [c.value for c in at.caption]
    assert any("measured in this tab: 2 repeat(s)" in c and "medians with their spread" in c for c in captions)


def dropped_caption(at) -> str | None:
    return next((v for v in at.markdown.values if "not committed: max_new_tokens was reached" in v), None)


def test_the_last_step_says_its_tokens_past_max_new_tokens_were_not_committed(tiny_checkpoint, tmp_path):
    block_size = random.randint(3, 5)
    max_new = 1 + 2 * block_size + random.randint(1, block_size - 1)  # the third step runs past it
    at = start()
    for key, value in (("block_size", block_size), ("budget", 2 * block_size), ("max_new_tokens", max_new)):
        at.sidebar.number_input(key=key).set_value(value)
    at.sidebar.slider(key="noise").set_value(0.0)
    run(at)
    press(at, "Run to end")
    steps = at.session_state["live"].decoder.steps
    dropped = num_dropped(steps, len(steps) - 1, max_new)
    assert len(steps) == 3 and dropped == block_size - (max_new - 1 - 2 * block_size)
    expected = f"not committed: max_new_tokens was reached, so the step's last {dropped} token(s) were dropped."
    assert expected in dropped_caption(at)
    assert metric(at, "Tokens committed") == str(steps[-1].num_committed - dropped)
    at.selectbox(key="inspect_step").set_value(0)
    run(at)
    assert dropped_caption(at) is None and metric(at, "Tokens committed") == str(steps[0].num_committed)

    cfg = DecodeConfig(budget=2 * block_size, block_size=block_size, max_new_tokens=max_new)
    _, runs, path = record(tiny_checkpoint, tmp_path, cfg, DrafterSpec(noise=0.0), ("ddtree",), 1)
    at.sidebar.text_input(key="report_path").set_value(str(path))
    run(at)
    press(at, "Run to end")
    assert expected in dropped_caption(at), "a recording's last step says so too"
