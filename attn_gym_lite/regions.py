"""Named regions of GPU work: :func:`mark_kernels`, a ``record_function`` range that costs nothing
more unless ``record_annotations`` is collecting region names. A leaf module, below models and capture."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["collect_region_names", "mark_kernels", "native_annotations_available"]

# The names entered while a collector is active (None: nobody is collecting).
_COLLECTED: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("attn_gym_lite_region_names", default=None)


def native_annotations_available() -> bool:
    """True where ``torch.cuda.graph_annotations`` (torch >= 2.14) is available (CUDA >= 13.1)."""
    module = getattr(torch.cuda, "graph_annotations", None)
    return module is not None and torch.cuda.is_available() and bool(module.is_available())


@contextmanager
def collect_region_names() -> Iterator[set[str]]:
    """Collect every :func:`mark_kernels` name entered inside the block into the yielded set."""
    # Nested, the inner block would take the names the outer one is waiting for.
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
    """Label the GPU work launched inside the block as region ``name`` (a ``record_function`` range).

    Inside a capture within ``record_annotations``, the graph nodes the block adds get ``name`` and
    their backward kernels ``"<name> backward"``; nested, the innermost region wins. No host
    synchronisation: safe inside a captured function.
    """
    if torch.compiler.is_compiling():
        # Under torch.compile the region is only a name: context variables and capture queries
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
