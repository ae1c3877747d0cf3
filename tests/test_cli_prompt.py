"""Where a text prompt comes from on the command line (--prompt-text, --prompt-file, --prompt-index), the warning for
one that ends at a bare line break, and the errors for a file or an index that does not fit."""
from __future__ import annotations

import argparse

import pytest

from cli import options as opts
from engine.loaders.prompt_text import line_break_note
from engine.loaders.shipped import DEFAULT_MODEL


@pytest.fixture(scope="module")
def pair():
    from engine.loaders.loading import load_model

    return load_model(DEFAULT_MODEL)


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    opts.add_prompt_args(p)
    return p.parse_args(list(argv))


def test_a_prompt_file_is_read_as_utf8_text_with_its_line_breaks(pair, tmp_path):
    text = "def area(r):\n    return 3.14 * r * r\n\n\nprint(ar"
    (tmp_path / "p.py").write_text(text, encoding="utf-8")
    assert opts.pick_prompt(parse("--prompt-file", str(tmp_path / "p.py")), pair) == pair.tokenizer.encode(text)


@pytest.mark.parametrize(("content", "message"), [(b"\xff\xfe", r"not UTF-8 text \(byte 0\)"), (None, "no such file")])
def test_a_prompt_file_that_is_not_text_is_a_clear_error(pair, tmp_path, content, message):
    path = tmp_path / "p.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(opts.CliError, match=message):
        opts.pick_prompt(parse("--prompt-file", str(path)), pair)


def test_prompt_index_picks_the_models_own_example(pair):
    last = len(pair.prompt_texts) - 1
    args = parse("--prompt-index", str(last))
    assert opts.pick_prompt(args, pair) == pair.tokenizer.encode(pair.prompt_texts[last])
    with pytest.raises(opts.CliError, match=rf"has {last + 1} example prompts.*give 0\.\.{last}"):
        opts.pick_prompt(parse("--prompt-index", str(last + 1)), pair)


def test_a_prompt_ending_at_a_bare_line_break_is_warned_about(pair, capsys):
    opts.pick_prompt(parse("--prompt-text", "def fibonacci(n):\n"), pair)
    assert "ends at a bare line break" in capsys.readouterr().err
    opts.pick_prompt(parse("--prompt-text", "def fibonacci(n):\n    "), pair)
    assert capsys.readouterr().err == ""
    assert line_break_note("x = 1") is None and line_break_note("x = 1\n") is not None


def test_the_prompt_sources_exclude_each_other():
    with pytest.raises(SystemExit):
        parse("--prompt-text", "a", "--prompt-index", "0")
