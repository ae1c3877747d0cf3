"""The dashboard under bad inputs and failures (Streamlit's AppTest): a model file replaced on disk loads again,
an engine error of any type is shown with its traceback and the app keeps working, and the waiting message names
the invalid input (the prompt, the drafter, or max new tokens out of the model's range); the kernel build runs in
the background from the app's start and says when it is done."""
from __future__ import annotations

import dataclasses
import random
import threading

import numpy as np
from test_app import metric, press, run, shown_tokens, start

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.loaders.kdtr import read_kdtr, write_kdtr
from ui import current, resources


def load_path(at, path) -> None:
    at.sidebar.text_input(key="model_path").set_value("")
    run(at)
    at.sidebar.text_input(key="model_path").set_value(str(path))
    run(at)
    assert not at.sidebar.error and at.sidebar.selectbox(key="model").value == str(path)


def test_a_model_file_replaced_on_disk_decodes_as_the_new_model(tiny_checkpoint, tmp_path):
    path = tmp_path / "m.kdtr"
    write_kdtr(path, tiny_checkpoint)
    rng = np.random.default_rng(random.randrange(1 << 30))
    other = dataclasses.replace(tiny_checkpoint, golden_tokens=None, golden_logits=None, weights={
        name: (w + rng.normal(0, 0.5, w.shape)).astype(np.float32) for name, w in
        tiny_checkpoint.numpy_weights().items()})
    prompt = tiny_checkpoint.prompt.tolist()
    old_tokens = decode(tiny_checkpoint, prompt, DecodeConfig(), "ar").tokens
    new_tokens = decode(other, prompt, DecodeConfig(), "ar").tokens
    assert old_tokens != new_tokens, "the replacement must decode differently for the test to mean anything"

    at = start()
    load_path(at, path)
    press(at, "Run to end")
    assert shown_tokens(at) == old_tokens
    write_kdtr(path, other)
    load_path(at, path)
    assert "changed on disk and was loaded again" in at.info[0].value
    press(at, "Run to end")
    assert shown_tokens(at) == decode(read_kdtr(path), prompt, DecodeConfig(), "ddtree").tokens == new_tokens


def test_an_unexpected_engine_error_is_a_message_with_its_traceback(monkeypatch):
    at = start()

    def broken(*args, **kwargs):
        raise RuntimeError("the decoder broke")

    monkeypatch.setattr(current, "make_decoder", broken)
    press(at, "Step")
    assert at.error[0].value.startswith("RuntimeError: the decoder broke")
    assert at.expander[0].label == "Traceback" and "broken" in at.expander[0].code[0].value
    monkeypatch.undo()
    press(at, "Step")
    assert metric(at, "Steps") == "1" and not at.error, "the app keeps working"


def test_the_waiting_message_names_the_invalid_input(tiny_checkpoint):
    at = start()
    at.sidebar.selectbox(key="drafter").set_value("dflash")
    run(at)
    assert at.warning[0].value.startswith("Decoding waits for a valid drafter") and not at.button

    at.sidebar.selectbox(key="drafter").set_value("oracle")
    context = tiny_checkpoint.config.max_position_embeddings
    prompt_len, block_size = len(tiny_checkpoint.prompt), DecodeConfig().block_size
    hi = context - prompt_len - block_size
    # past the range but within the widget's own maximum, the context
    at.sidebar.number_input(key="max_new_tokens").set_value(hi + random.randint(1, context - hi))
    run(at)
    error = at.sidebar.error[0].value
    assert error.startswith("Max new tokens: ") and f"expected 1 to {hi}" in error
    assert at.warning[0].value.startswith("Decoding waits for a valid max new tokens") and not at.button
    at.sidebar.number_input(key="max_new_tokens").set_value(hi)
    run(at)
    assert not at.sidebar.error
    press(at, "Step")
    assert metric(at, "Steps") == "1"


def test_the_kernel_build_starts_with_the_app_and_says_when_it_is_done(monkeypatch):
    import kernels

    gate, real = threading.Event(), kernels.load
    monkeypatch.setattr(kernels, "load", lambda: gate.wait(60) and real())
    resources.kernel_build.clear()
    at = start()
    assert "Building the DDTree kernels in the background" in at.info[0].value
    assert not resources.kernel_build().done
    gate.set()
    resources.kernel_build().thread.join(60)
    run(at)
    assert not any("Building the DDTree kernels" in i.value for i in at.info)
    assert at.toast[0].value.startswith("The DDTree kernel build is done")
    press(at, "Step")
    assert metric(at, "Steps") == "1"
