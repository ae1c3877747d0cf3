"""ui.safe_text.plain: strings from files and links render in Streamlit's markdown as themselves. Checked by
rendering with markdown-it (CommonMark): no image, link, heading, emphasis or autolink comes out of a hostile
string, and the rendered text is the string; then in AppTest, a recording whose device name is an image."""
from __future__ import annotations

import html
import json
import random
import re

import pytest
from markdown_it import MarkdownIt
from recordings import record
from test_app import run, start

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from ui.safe_text import code, plain

IMAGE = "![x](http://127.0.0.1:9/x.png)"
HOSTILE = [IMAGE, "[click](http://evil.example)", "<http://evil.example>", "<a@evil.example>", "# Heading",
           "> quoted", "- item", "1. item", "**bold** *em* _em_ ~~gone~~", "$x^2$", ":red[alert]", "a\n===",
           "[x]: http://evil.example\n[x]", "<img src=http://127.0.0.1:9/y.png>", "x\\*y", "|a|b|\n|-|-|"]
PLAIN = ["hidden_size=32, but the target's hidden_size is 64", "ids in [0, 4096)", "['a', 'b']", "<0x0A>·↵",
         "cpu: x86_64, 2 threads", "B = 4, block size 5"]
MD = MarkdownIt("commonmark").enable("strikethrough").enable("table")


def rendered(markdown: str) -> str:
    return MD.render(markdown)


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page)).strip()


@pytest.mark.parametrize("text", HOSTILE + PLAIN)
def test_plain_text_renders_as_itself(text):
    page = rendered(plain(text))
    assert re.findall(r"<(img|a|h\d|em|strong|s|del|blockquote|ul|ol|li|table|code)\b", page) == [], page
    assert text_of(page).split() == text.split(), page  # the characters, whitespace aside


@pytest.mark.parametrize("text", PLAIN)
def test_common_text_is_left_alone(text):
    assert plain(text) == text


@pytest.mark.parametrize("text", HOSTILE + PLAIN + ["a`b", "`x`", "``![x](http://127.0.0.1:9/x.png)``"])
def test_a_code_span_shows_its_text_literally(text):
    page = rendered(code(text))
    assert page.count("<code>") == 1 and "<img" not in page and "<a " not in page, page
    assert text_of(page) == " ".join(text.split("\n")) if "\n" in text else text_of(page) == text, page


def test_a_recordings_device_name_shows_as_text_not_an_image(tiny_checkpoint, tmp_path):
    cfg = DecodeConfig(budget=4, block_size=3, max_new_tokens=6)
    _, _, path = record(tiny_checkpoint, tmp_path, cfg, DrafterSpec(noise=0.3, seed=random.randrange(1000)),
                        ("ddtree",), 1)
    doc = json.loads(path.read_bytes())
    doc["environment"]["device_name"] = IMAGE
    path.write_text(json.dumps(doc))
    at = start()
    at.sidebar.text_input(key="report_path").set_value(str(path))
    run(at)
    banner = next(i.value for i in at.info if i.value.startswith("**A recording**"))
    assert plain(IMAGE) in banner and "<img" not in rendered(banner)
    assert IMAGE in text_of(rendered(banner))
