"""gpu-check runs every CUDA test: each test file that skips a test for want of a GPU is one gpu-check runs (whole, or
its CUDA tests by the cuda marker, which tests/conftest.py gives every such test)."""
from __future__ import annotations

import pathlib
import re

import pytest
from conftest import pytest_collection_modifyitems

from cli.gpu_check import CUDA_MARKED_TESTS, CUDA_TESTS

REPO = pathlib.Path(__file__).resolve().parents[1]
CUDA_SKIP = re.compile(r'reason="needs (a|\d) CUDA GPU')


def test_every_file_with_a_cuda_test_is_run_by_gpu_check():
    holding = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").glob("test_*.py")
               if p.name != pathlib.Path(__file__).name and CUDA_SKIP.search(p.read_text())}
    run = set(CUDA_TESTS) | set(CUDA_MARKED_TESTS)
    assert holding - run == set(), "add these files to cli/gpu_check.py's lists"
    assert all((REPO / f).is_file() for f in run) and not set(CUDA_TESTS) & set(CUDA_MARKED_TESTS)


class _Item:
    """What the collection hook reads and writes of a collected test."""

    def __init__(self, *marks):
        self.marks = [m.mark for m in marks]

    def iter_markers(self, name):
        return (m for m in self.marks if m.name == name)

    def add_marker(self, mark):
        self.marks.append(mark.mark)


def test_conftest_marks_the_tests_skipped_for_want_of_a_gpu():
    gpu = _Item(pytest.mark.skipif(False, reason="needs a CUDA GPU (torch sees none)"))
    two = _Item(pytest.mark.browser, pytest.mark.skipif(False, reason="needs 2 CUDA GPUs (torch sees fewer)"))
    other = _Item(pytest.mark.skipif(False, reason="nvcc is not on PATH"))
    pytest_collection_modifyitems(None, [gpu, two, other])
    assert [[m.name for m in item.iter_markers("cuda")] for item in (gpu, two, other)] == [["cuda"], ["cuda"], []]
