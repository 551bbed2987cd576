"""Shared test set-up: CPU-safe plotting, Triton's interpreter without a GPU, and the ``gpu``
marker that skips without CUDA."""

import os

import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# Without a GPU, Triton kernels run on CPU tensors through the interpreter. It must be set before
# any kernel is defined, i.e. before the test modules import attn_gym_lite's kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew (pyplot keeps every open figure alive and warns past 20)."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
