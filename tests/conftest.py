"""Shared test set-up: CPU-safe plotting, and the ``gpu`` marker that skips without CUDA."""

import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
