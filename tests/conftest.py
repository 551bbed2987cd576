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


def pytest_runtest_logreport(report):
    """With ``ATTN_GYM_LITE_FAILURE_LOG`` set, append each failure's report to that file as it
    happens: pytest prints tracebacks only at the end of the run, which a run killed at its time
    limit on the GPU host never reaches (scripts/gpu_record.sh sets it per test lane)."""
    path = os.environ.get("ATTN_GYM_LITE_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as file:
            file.write(f"=== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew (pyplot keeps every open figure alive and warns past 20)."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
