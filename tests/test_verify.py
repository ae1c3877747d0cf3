"""`python -m engine verify`: the moment of truth, its PASS and FAIL lines and exit codes."""
from __future__ import annotations

import dataclasses

import numpy as np

from cli.__main__ import main
from engine.loaders.kdtr import write_kdtr


def test_verify_passes_on_the_bundled_fixture(capsys, tiny_checkpoint):
    assert main(["verify", "--fixture", "models/model_tiny.kdtr"]) == 0
    out = capsys.readouterr().out.splitlines()
    golden = " ".join(map(str, tiny_checkpoint.golden_tokens))
    assert out[0] == f"golden : {golden}" and out[1] == f"ar     : {golden}" and out[2] == f"ddtree : {golden}"
    assert out[3] == "DDTree stats: steps=3 committed=25 avg_accept=8.00 tokens/step (block_size=8)"
    assert out[4].startswith("max |AR logit - golden logit| = ") and float(out[4].split("= ")[1]) < 1e-4
    assert out[5].startswith("PASS")


def test_verify_names_the_first_mismatch(capsys, tiny_checkpoint, tmp_path):
    pos = int(np.random.default_rng().integers(3, len(tiny_checkpoint.golden_tokens)))
    tokens, logits = tiny_checkpoint.golden_tokens.copy(), tiny_checkpoint.golden_logits.copy()
    wrong = int((tokens[pos] + 1) % tiny_checkpoint.config.vocab_size)
    tokens[pos] = wrong
    logits[pos, wrong] = logits[pos].max() + 1.0  # a consistent (loadable) but wrong golden entry
    path = tmp_path / "wrong.kdtr"
    write_kdtr(path, dataclasses.replace(tiny_checkpoint, golden_tokens=tokens, golden_logits=logits))
    assert main(["verify", "--fixture", str(path)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    real = int(tiny_checkpoint.golden_tokens[pos])
    assert last == f"FAIL AR differs from golden at position {pos}: golden {wrong}, ar {real}"


def test_verify_in_bfloat16_checks_ddtree_against_ar(capsys):
    """On the shipped pair in bfloat16: the fast mode passes with DDTree == AR or a divergence it names a numerics
    near tie; the batch-invariant mode passes with DDTree == AR token for token."""
    def verify(*options: str) -> tuple[dict[str, str], str]:
        assert main(["verify", "--dtype", "bfloat16", *options]) == 0
        lines = capsys.readouterr().out.splitlines()
        return {line.split(":")[0].strip(): line.split(":")[1] for line in lines
                if line.startswith(("ar ", "ddtree "))}, lines[-1]

    rows, last = verify()
    if rows["ar"] == rows["ddtree"]:
        assert last.startswith("PASS model_ddtree DDTREE==AR in bfloat16")
    else:
        assert last.startswith("PASS model_ddtree in bfloat16") and "numerics near tie" in last
    rows, last = verify("--batch-invariant")
    assert rows["ar"] == rows["ddtree"] and last.startswith("PASS model_ddtree DDTREE==AR in bfloat16")


def test_verify_without_golden_tokens_checks_against_ar(capsys, tiny_checkpoint, tmp_path):
    path = tmp_path / "no_golden.kdtr"
    write_kdtr(path, dataclasses.replace(tiny_checkpoint, golden_tokens=None, golden_logits=None))
    assert main(["verify", "--fixture", str(path), "--tree", "both", "--noise", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("golden") for line in lines)
    ar, chain, dd = (line.split(":")[1] for line in lines[:3])
    assert ar == chain == dd == " " + " ".join(map(str, tiny_checkpoint.golden_tokens))
    assert lines[-1] == "PASS model_ddtree CHAIN==AR and DDTREE==AR (24 tokens), greedy-exact; no golden tokens: " \
                        "checked against AR"
