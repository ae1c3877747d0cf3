"""The sequence-level unlikelihood term (engine/training/unlikelihood.py) and train-target's --init-from: the repeat
mask against a plain-Python scan, the loss against float64 and its gradient, and a fine-tune of the tiny target that
loops far less with the term than without it, at nearly the same validation loss."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cli.__main__ import main as cli_main
from engine.training.unlikelihood import repeated_ngram_mask, unlikelihood_loss


def python_repeat_mask(row: list[int], start: int, n: int) -> list[bool]:
    """Position t repeats when the n-gram ending at t, lying wholly at or after start, ended earlier too."""
    seen, mask = set(), [False] * len(row)
    for t in range(start + n - 1, len(row)):
        gram = tuple(row[t - n + 1:t + 1])
        mask[t] = gram in seen
        seen.add(gram)
    return mask


def test_repeat_mask_equals_a_plain_scan():
    rng = np.random.default_rng(seed := int(np.random.SeedSequence().entropy % 2**32))
    for _ in range(40):
        rows, length, vocab = int(rng.integers(1, 5)), int(rng.integers(0, 40)), int(rng.integers(2, 5))
        tokens = torch.from_numpy(rng.integers(0, vocab, (rows, length)))
        start, n = int(rng.integers(0, length + 1)), int(rng.integers(1, 6))
        want = [python_repeat_mask(r, start, n) for r in tokens.tolist()]
        assert repeated_ngram_mask(tokens, start, n).tolist() == want, (seed, start, n)


def test_repeat_mask_of_a_loop_and_bad_arguments():
    loop = torch.tensor([[9, 9, 1, 2, 3, 1, 2, 3, 1, 2]])  # the prompt is 9 9; the continuation loops with period 3
    assert repeated_ngram_mask(loop, 2).int().tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 1]]
    assert repeated_ngram_mask(loop, 0, n=5).nonzero().tolist() == [[0, 9]]  # 1 2 3 1 2 again
    assert not repeated_ngram_mask(loop, 0, n=8).any()
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        repeated_ngram_mask(loop[0], 0)
    with pytest.raises(ValueError, match="start=11"):
        repeated_ngram_mask(loop, 11)


def test_unlikelihood_loss_equals_float64_and_its_gradient_is_bounded():
    torch.manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    logits = (torch.randn(3, 7, 11) * 4).requires_grad_()
    targets = torch.randint(0, 11, (3, 7))
    penalised = torch.rand(3, 7) < 0.5
    loss = unlikelihood_loss(logits, targets, penalised)
    p = logits.detach().double().softmax(-1).gather(-1, targets[..., None])[..., 0]
    want = -(torch.log1p(-p) * penalised).sum() / penalised.numel()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    loss.backward()
    at_target = logits.grad.gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(at_target, (p * penalised / penalised.numel()).float(), atol=1e-6)

    # a token the model is all but sure of: a large, finite penalty whose gradient pushes it down at full strength
    sure = torch.zeros(1, 1, 5)
    sure[0, 0, 2] = 200.0
    sure.requires_grad_()
    loss = unlikelihood_loss(sure, torch.tensor([[2]]), torch.tensor([[True]]))
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 100
    assert sure.grad[0, 0, 2].item() == pytest.approx(1.0)


def fine_tune(capsys, base, corpus, out, *extra: str) -> dict:
    code = cli_main(["train-target", "--out", str(out), "--preset", "tiny", "--device", "cpu", "--init-from",
                     str(base), "--corpus-dir", str(corpus), "--steps", "24", "--lr", "1e-3", "--seed", "1",
                     "--log-every", "8", "--eval-every", "24", "--checkpoint-every", "24", *extra])
    assert code == 0, capsys.readouterr().err
    return json.loads((out / "training.json").read_text())


def test_unlikelihood_fine_tune_loops_less_at_the_same_loss(tiny_target_run, small_corpus, tmp_path, capsys):
    base = tiny_target_run[0]
    plain = fine_tune(capsys, base, small_corpus, tmp_path / "plain")
    ul = fine_tune(capsys, base, small_corpus, tmp_path / "ul", "--unlikelihood-weight", "1",
                   "--unlikelihood-batch", "24", "--unlikelihood-every", "2")
    rates = plain["greedy_sample"]["distinct_4gram_rate"], ul["greedy_sample"]["distinct_4gram_rate"]
    assert rates[1] > rates[0] + 0.15, rates
    assert ul["final_val_loss"] < plain["final_val_loss"] + 0.05, (plain["final_val_loss"], ul["final_val_loss"])
    for entry in ul["intervals"]:
        assert 0 <= entry["repeated_share"] <= 1 and entry["unlikelihood"] >= 0
    assert "unlikelihood" not in plain["intervals"][0]
    # both start from the base's weights, tokenizer and record
    base_record = json.loads((base / "training.json").read_text())
    for report in (plain, ul):
        assert report["initial_model"] == {"directory": str(base.resolve()), "training": base_record}
        assert report["tokenizer"]["source"] == str(base)
    assert (tmp_path / "ul" / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()


def test_unlikelihood_runs_resume_exactly(tiny_target_run, small_corpus, tmp_path, capsys):
    common = ["--preset", "tiny", "--device", "cpu", "--init-from", str(tiny_target_run[0]), "--corpus-dir",
              str(small_corpus), "--steps", "6", "--log-every", "3", "--eval-every", "6", "--checkpoint-every", "3",
              "--unlikelihood-weight", "0.5", "--unlikelihood-batch", "16", "--unlikelihood-every", "3",
              "--save-dtype", "float32"]
    assert cli_main(["train-target", "--out", str(tmp_path / "whole"), *common]) == 0
    assert cli_main(["train-target", "--out", str(tmp_path / "parts"), *common, "--pause-at", "3"]) == 0
    assert cli_main(["train-target", "--out", str(tmp_path / "parts"), "--resume"]) == 0
    whole, parts = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "parts"))
    assert all(torch.equal(whole[k], parts[k]) for k in whole)


INIT_ERRORS = [
    (["--init-from", "/nonexistent"], "not a directory"),
    (["--init-from", "{base}", "--tokenizer", "{base}"], "drop --tokenizer"),
    (["--init-from", "{base}", "--preset", "showcase"], "is not the showcase preset's"),
    (["--unlikelihood-weight", "-1"], "unlikelihood_weight=-1.0"),
    (["--unlikelihood-weight", "1", "--unlikelihood-batch", "61"], "exceeds the 60 prompts"),
    (["--unlikelihood-weight", "1", "--unlikelihood-every", "7"], "must divide log_every=25"),
    (["--unlikelihood-weight", "1", "--unlikelihood-batch", "0"], "unlikelihood_batch=0"),
]


@pytest.mark.parametrize(("argv", "message"), INIT_ERRORS, ids=[m for _, m in INIT_ERRORS])
def test_bad_init_and_unlikelihood_options_fail_clearly(argv, message, tiny_target_run, tmp_path, capsys):
    argv = [a.format(base=tiny_target_run[0]) for a in argv]
    code = cli_main(["train-target", "--out", str(tmp_path / "run"), "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists(), "a refused run leaves nothing behind"
