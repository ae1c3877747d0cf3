"""benchmarks.stage_corpus: which stdlib (torch, package) files the shipped pair's corpus keeps, a refused existing
folder, a torch other than the pinned one and a package at another version than the corpus names."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

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


def test_with_torch_adds_its_own_sources_and_leaves_out_tests_vendored_and_generated(tmp_path, monkeypatch, capsys):
    lib, torch_dir = tmp_path / "lib", tmp_path / "torch"
    kept = {"nn/modules/linear.py", "_inductor/lowering.py", "__init__.py"}
    dropped = {"testing/_internal/common_utils.py", "_vendor/packaging/version.py",
               "_inductor/fx_passes/serialized_patterns/_sfdp_pattern_1.py", "__pycache__/x.py"}
    for root, files in ((lib, {"os.py"}), (torch_dir, kept | dropped)):
        for rel in files:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {rel}\n")
    monkeypatch.setattr(stage_corpus.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    monkeypatch.setattr(stage_corpus, "torch_root", lambda: torch_dir)
    out = tmp_path / "out"
    assert stage_corpus.main(["--with-torch", str(out)]) == 0
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.py")} == {"os.py"} | {f"torch/{f}" for f in kept}
    assert "from " + str(torch_dir) in capsys.readouterr().out


def test_only_the_pinned_torch_is_staged(tmp_path, monkeypatch):
    import torch

    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy>=1.26\ntorch==2.12.5  # the CPU build\n")
    assert stage_corpus.pinned_version("torch", requirements) == "2.12.5"
    assert stage_corpus.pinned_version("numpy", requirements) is None
    monkeypatch.setattr(stage_corpus, "REQUIREMENTS", requirements)
    monkeypatch.setattr(torch, "__version__", "2.99.1+cu130")
    with pytest.raises(SystemExit, match=r"torch 2\.99\.1 is installed but .* pins 2\.12\.5"):
        stage_corpus.torch_root()
    monkeypatch.setattr(torch, "__version__", "2.12.5+cpu")
    assert (stage_corpus.torch_root() / "__init__.py").is_file()


def test_with_packages_adds_each_under_its_name_less_generated_parsers(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    (lib / "os.py").parent.mkdir(parents=True)
    (lib / "os.py").write_text("import sys\n")
    sources = {}
    for name in stage_corpus.PACKAGES:
        kept = {"__init__.py", f"core/{name}_{random.randrange(10**6)}.py", "tests/test_core.py"}
        dropped = {"parsing/latex/_antlr/latexparser.py", "parsing/autolev/test-examples/ex1.py", "__pycache__/c.py"}
        for rel in kept | dropped:
            path = tmp_path / "site" / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {name}: {rel}\n")
        sources[name] = kept
    monkeypatch.setattr(stage_corpus.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    monkeypatch.setattr(stage_corpus, "package_root", lambda name, version: tmp_path / "site" / name)
    out = tmp_path / "out"
    assert stage_corpus.main(["--with-packages", str(out)]) == 0
    expected = {"os.py"} | {f"{name}/{rel}" for name, kept in sources.items() for rel in kept}
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.py")} == expected


def test_a_package_at_another_version_or_missing_is_refused(monkeypatch):
    name = random.choice(sorted(stage_corpus.PACKAGES))
    monkeypatch.setattr(stage_corpus.metadata, "version", lambda _: "0.0.1")
    with pytest.raises(SystemExit, match=rf"{name} 0\.0\.1 is installed but the corpus is staged from {name} "):
        stage_corpus.package_root(name, stage_corpus.PACKAGES[name])

    def missing(_):
        raise stage_corpus.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(stage_corpus.metadata, "version", missing)
    with pytest.raises(SystemExit, match=rf"{name} is not installed; install {name}=="):
        stage_corpus.package_root(name, stage_corpus.PACKAGES[name])


def test_an_installed_package_at_its_version_is_found(monkeypatch):
    import numpy

    monkeypatch.setattr(stage_corpus.metadata, "version", lambda _: "9.9")
    assert stage_corpus.package_root("numpy", "9.9") == Path(numpy.__file__).parent


def test_with_app_packages_adds_each_under_its_import_name_less_generated_code(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    (lib / "os.py").parent.mkdir(parents=True)
    (lib / "os.py").write_text("import sys\n")
    kept = {"__init__.py", f"runtime/app_{random.randrange(10**6)}.py", "tests/test_api.py"}
    dropped = {"proto/Block_pb2.py", "descriptor_pb2.py", "graph_objs/layout/_xaxis.py", "vegalite/v6/schema/core.py",
               "inference/_generated/types.py", "_vendor/six.py", "vendored/version.py", "idnadata.py",
               "uts46data.py", "__pycache__/c.py"}
    for name in stage_corpus.APP_PACKAGES:
        for rel in kept | dropped:
            path = tmp_path / "site" / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {name}: {rel}\n")
    seen = []

    def package_root(name, version, distribution, option):
        seen.append((name, distribution, version, option))
        return tmp_path / "site" / name

    monkeypatch.setattr(stage_corpus.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    monkeypatch.setattr(stage_corpus, "package_root", package_root)
    out = tmp_path / "out"
    assert stage_corpus.main(["--with-app-packages", str(out)]) == 0
    expected = {"os.py"} | {f"{name.replace('.', '/')}/{rel}" for name in stage_corpus.APP_PACKAGES for rel in kept}
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.py")} == expected
    assert seen == [(n, d, v, "--with-app-packages") for n, (d, v) in stage_corpus.APP_PACKAGES.items()]


def test_an_app_package_is_found_by_its_import_name_and_checked_by_its_distribution(monkeypatch):
    import yaml

    versions = {"pyyaml": "6.0.3"}
    monkeypatch.setattr(stage_corpus.metadata, "version", lambda dist: versions[dist])
    assert stage_corpus.package_root("yaml", "6.0.3", "pyyaml", "--with-app-packages") == Path(yaml.__file__).parent
    refused = r"pyyaml 6\.0\.3 is installed but the corpus is staged from pyyaml 7\.0: install pyyaml==7\.0 \(or stage"
    with pytest.raises(SystemExit, match=refused + r" it without --with-app-packages\)"):
        stage_corpus.package_root("yaml", "7.0", "pyyaml", "--with-app-packages")
    with pytest.raises(SystemExit, match="has no package typing_extensions"):
        versions["typing-extensions"] = "4.0"
        stage_corpus.package_root("typing_extensions", "4.0", "typing-extensions", "--with-app-packages")
