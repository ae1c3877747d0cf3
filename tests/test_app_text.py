"""The dashboard's default: the first model under models/ (a trained text target with its DFlash drafter beside
it), prompted with text. Tokens show as their text pieces with ids on hover, the committed text reads as text,
tree nodes carry their pieces, and token ids stay available as a prompt input."""
from __future__ import annotations

import html
import json
import random
import re

import pytest
from greedy import assert_greedy_equal
from test_app import metric, press, run, shown_tokens, start

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.loading import load_model
from engine.loaders.shipped import MODELS_DIR, bundled_models
from ui.safe_text import plain


@pytest.fixture(scope="module")
def pair():
    """The default model's name and checkpoint (skips when no model is committed under models/)."""
    dirs = sorted(p.parent for p in MODELS_DIR.glob("*/config.json"))
    if not dirs:
        pytest.skip("no model directory under models/")
    return dirs[0].name, load_model(dirs[0])


def chip_pieces(at) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"white-space:pre\">(.*?)</span>", at.html[0].value)]


def test_the_default_is_the_first_model_with_its_prompt_text_and_drafter(pair):
    name, ckpt = pair
    at = start(None)
    assert next(iter(bundled_models())) == name and at.sidebar.selectbox(key="model").value == name
    assert at.sidebar.radio(key="prompt_source").value == "text"
    assert at.sidebar.text_area(key="prompt_box").value == ckpt.prompt_texts[0]
    assert at.sidebar.selectbox(key="drafter").value == "dflash"
    assert at.sidebar.text_input(key="drafter_model").value == str(dflash_dir_beside(ckpt.source))
    assert at.session_state["live"].settings.prompt == tuple(ckpt.tokenizer.encode(ckpt.prompt_texts[0]))


def test_tokens_render_as_pieces_with_ids_and_the_text_reads_as_text(pair):
    name, ckpt = pair
    at = start(None)
    at.sidebar.number_input(key="budget").set_value(random.randint(2, 256))
    press(run(at), "Step")
    ladder, icicle = (json.loads(chart.proto.spec)["data"] for chart in at.main.get("plotly_chart")[:2])
    step = at.session_state["live"].decoder.steps[0]
    real = [n for n in range(step.tree.num_nodes) if n == 0 or step.tree.parents[n] >= 0]
    pieces = [ckpt.tokenizer.piece(step.tree.tokens[n]) for n in real]
    labels = icicle[0]["labels"]
    assert all(label == p or (label.endswith("…") and p.startswith(label[:-1]))
               for label, p in zip(labels, pieces, strict=True)), "every node of the icicle shows its piece"
    boxes = ladder[-1]
    for node, text in zip(boxes["customdata"], boxes["text"], strict=True):
        if node >= 0:
            shown = html.unescape(re.match(r"<b>(.*?)</b>", text).group(1))
            assert ckpt.tokenizer.piece(step.tree.tokens[node]).startswith(shown.removesuffix("…"))
    assert any(v.startswith("Step 0: tree of") and f"`{ckpt.tokenizer.piece(step.bonus)}`" in v
               for v in at.markdown.values)

    press(at, "Run to end")
    ids = shown_tokens(at)
    assert chip_pieces(at) == [ckpt.tokenizer.piece(t) for t in ids]
    prompt = list(at.session_state["live"].settings.prompt)
    ar = decode(ckpt, prompt, DecodeConfig(), "ar")
    assert_greedy_equal(ar.tokens, ar.logits, ids)
    text = html.unescape(re.sub(r"<[^>]+>", "", at.html[1].value))
    assert text == ckpt.prompt_texts[0] + ckpt.tokenizer.decode(ids), "the prompt, then the committed text"
    assert metric(at, "Status") == "done"


def test_example_prompts_token_ids_and_an_empty_text(pair):
    name, ckpt = pair
    at = start(None)
    if len(ckpt.prompt_texts) > 1:
        index = random.randrange(1, len(ckpt.prompt_texts))
        at.sidebar.selectbox(key="prompt_example").set_value(index)
        run(at)
        assert at.sidebar.text_area(key="prompt_box").value == ckpt.prompt_texts[index]
        assert at.session_state["live"].settings.prompt == tuple(ckpt.tokenizer.encode(ckpt.prompt_texts[index]))
    at.sidebar.text_area(key="prompt_box").set_value("")
    run(at)
    assert "the text is empty" in at.sidebar.error[0].value and "valid prompt" in at.warning[0].value
    typed = "def f(x):\n    return x"
    at.sidebar.text_area(key="prompt_box").set_value(typed)
    run(at)
    assert at.session_state["live"].settings.prompt == tuple(ckpt.tokenizer.encode(typed))

    at.sidebar.radio(key="prompt_source").set_value("token ids")
    run(at)
    ids = [random.randrange(ckpt.tokenizer.vocab_size) for _ in range(5)]
    at.sidebar.text_input(key="prompt_text").set_value(" ".join(map(str, ids)))
    run(at)
    assert at.session_state["live"].settings.prompt == tuple(ids)
    shown = plain(f"As text: {ckpt.tokenizer.decode(ids)!r}")  # markdown's characters escaped, as the page does
    assert any(shown in c.value for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]
    press(at, "Step")
    assert metric(at, "Steps") == "1"
