"""Named regions of GPU work: :func:`mark_kernels`, the one thing models need from profiling.

A model wraps its stages in ``with mark_kernels("attention"):``. That is always a
``torch.profiler.record_function`` range (eager traces show it), and it costs nothing else unless
someone is recording: :func:`attn_gym_lite.profiling.record_annotations` turns on
:func:`collect_region_names` so it learns which regions a capture entered, and where torch's own
graph annotations work (torch >= 2.14 with CUDA >= 13.1) a capture also enters
``torch.cuda.graph_annotations.mark_kernels``, which tags the graph nodes the region adds.

This is a leaf module: models and the capture machinery import it, it imports nothing of the
package but the argument checks, and profiling builds on it (never the other way round).

Source: ``torch.cuda.graph_annotations`` (torch 2.14 docs); the "Profiling" chapter.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["collect_region_names", "mark_kernels", "native_annotations_available"]

# The names entered while a collector is active (None: nobody is collecting).
_COLLECTED: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "attn_gym_lite_region_names", default=None
)


def native_annotations_available() -> bool:
    """True where torch's own graph annotations work: the public
    ``torch.cuda.graph_annotations`` module (torch >= 2.14) reports ``is_available()`` (a CUDA
    device, ``cuda-bindings`` and a driver with ``cudaGraphNodeGetToolsId``, CUDA >= 13.1)."""
    module = getattr(torch.cuda, "graph_annotations", None)
    return module is not None and torch.cuda.is_available() and bool(module.is_available())


@contextmanager
def collect_region_names() -> Iterator[set[str]]:
    """Collect every :func:`mark_kernels` name entered inside the block into the yielded set.

    Raises:
        RuntimeError: a collector is already active (blocks do not nest).
    """
    if _COLLECTED.get() is not None:
        raise RuntimeError("collect_region_names: blocks cannot be nested; one is already active")
    names: set[str] = set()
    token = _COLLECTED.set(names)
    try:
        yield names
    finally:
        _COLLECTED.reset(token)


@contextmanager
def mark_kernels(name: str) -> Iterator[None]:
    """Label the GPU work launched inside the block as region ``name``.

    Always a ``torch.profiler.record_function(name)`` range, so eager traces show the region.
    Inside a capture within ``profiling.record_annotations``, the graph nodes the block adds are
    attributed to ``name`` (and, through autograd, their backward kernels to
    ``"<name> backward"``). Nested regions: the innermost wins for forward work; a backward
    kernel is labelled by the forward region of its autograd node, whatever region is open when
    the backward runs. Where torch's graph annotations work (torch >= 2.14, CUDA >= 13.1),
    every capture also enters ``torch.cuda.graph_annotations.mark_kernels(name)``. No host
    synchronisation: safe inside a captured function.

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"mark_kernels: name must be a non-empty string, got {name!r}")
    if torch.compiler.is_compiling():
        # Inside torch.compile the region is only a name: context variables and capture queries
        # would break the traced graph, and a compiled region has its own kernels anyway.
        yield
        return
    collected = _COLLECTED.get()
    if collected is not None:
        collected.add(name)
    with torch.profiler.record_function(name):
        # torch's own annotations whenever they work, also for a capture made directly with
        # torch.cuda.graph(..., enable_annotations=True) outside record_annotations.
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing() and native_annotations_available():
            with torch.cuda.graph_annotations.mark_kernels(name):
                yield
        else:
            yield
