"""benchmarks.stage_corpus: which stdlib files the shipped pair's corpus keeps, and a refused existing folder."""
from __future__ import annotations

import random

from benchmarks import stage_corpus


def test_keeps_tests_and_library_code_and_drops_the_rest(tmp_path, monkeypatch, capsys):
    root = tmp_path / "lib"
    rng = random.Random()
    kept = {"os.py", "test/test_os.py", "email/tests/t.py", "json/decoder.py"}
    dropped = {"encodings/cp1252.py", "lib2to3/fixer.py", "site-packages/x.py", "_sysconfigdata_linux.py",
               "config-3.11/makesetup.py", "latin1.py", "huge.py", "notes.txt"}
    for rel in kept | dropped:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"x = {rng.randrange(10**6)}\n")
    (root / "latin1.py").write_bytes(b"s = '\xe9'\n")
    (root / "huge.py").write_text("#" * (stage_corpus.MAX_BYTES + 1))
    assert {p.relative_to(root).as_posix() for p in stage_corpus.staged_files(root)} == kept

    monkeypatch.setattr(stage_corpus.sysconfig, "get_paths", lambda: {"stdlib": str(root)})
    out = tmp_path / "out"
    assert stage_corpus.main([str(out)]) == 0
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.py")} == kept
    assert (out / "os.py").read_bytes() == (root / "os.py").read_bytes()
    assert stage_corpus.main([str(out)]) == 2 and "exists" in capsys.readouterr().err
