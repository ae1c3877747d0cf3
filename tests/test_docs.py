"""The README and docs/ stay a true map: every relative link (and its #anchor) and every backticked repository path
they name exists, the README stays short, and its first lines hold the two commands that .ci/run runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
MAX_README_LINES = 300
DASHBOARD_COMMAND = "pip install -r requirements.txt && streamlit run app.py"
TEST_COMMAND = "pip install -r requirements-test.txt && python -m pytest -q"
# A backticked span that starts with one of the repository's top-level folders (or is a root file) names a path.
TOP_LEVEL = ("engine", "cli", "profiling", "ui", "app_pages", "kernels", "benchmarks", "models", "tests", "docs")
ROOT_FILES = ("app.py", "README.md", "requirements.txt", "requirements-test.txt", "pyproject.toml", ".ci/run")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(rf"^(?:{'|'.join(TOP_LEVEL)})/[\w./*-]*$")
CODE_BLOCK = re.compile(r"^```.*?^```", flags=re.S | re.M)


def relative_links(text: str) -> list[str]:
    """Link targets that point into the repository or into the same page (not web addresses)."""
    return [target for target in LINK.findall(CODE_BLOCK.sub("", text)) if not re.match(r"^[a-z]+:", target)]


def anchors(text: str) -> set[str]:
    """The #anchors of a Markdown page's headings, as GitHub makes them."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", CODE_BLOCK.sub("", text), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def repository_paths(text: str) -> list[str]:
    """Backticked spans that are a repository path: `engine/config.py`, `docs/*.png`, `models/`, `app.py`."""
    text = CODE_BLOCK.sub("", text)  # code blocks hold commands and output, not paths
    spans = [span.strip() for span in CODE_SPAN.findall(text)]
    return [span for span in spans if PATH.match(span) or span in ROOT_FILES]


def exists(path: Path) -> bool:
    return any(path.parent.glob(path.name)) if "*" in path.name else path.exists()


def missing_targets(doc: Path, root: Path = ROOT) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    missing = []
    for target in relative_links(text):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not exists(linked):
            missing.append(f"link {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            missing.append(f"anchor {target}")
    missing += [f"path `{path}`" for path in repository_paths(text) if not exists(root / path)]
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_link_and_named_path_exists(doc):
    missing = missing_targets(doc)
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_a_broken_link_or_path_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "page.md"
    (tmp_path / "README.md").write_text("# a map\n", encoding="utf-8")
    doc.write_text("# Top\n\nSee [ops](ops.md), [web](https://example.org), [here](#top), [gone](#bottom), "
                   "[map](../README.md#a-map), [section](../README.md#no-such-section), "
                   "`engine/no_such_module.py`, `docs/page.md` and `README.md`.\n", encoding="utf-8")
    assert missing_targets(doc, root=tmp_path) == [
        "link ops.md", "anchor #bottom", "anchor ../README.md#no-such-section", "path `engine/no_such_module.py`"]


def test_the_readme_is_a_short_map():
    num_lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_README_LINES, f"README.md has {num_lines} lines; move detail into docs/"


def test_the_readme_opens_with_the_commands_ci_runs():
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:6]
    assert f"Dashboard: `{DASHBOARD_COMMAND}`" in head
    assert f"Tests: `{TEST_COMMAND}`" in head
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in ci_lines, ".ci/run no longer runs the README's test command verbatim"
