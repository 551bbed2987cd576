"""Capturing a function as a CUDA graph, and the static buffers a graph reads.

A CUDA graph records the kernels a function launches, with the exact addresses they read and
write, and replays them with one launch. Two consequences shape this module:

* capture must see a *warmed-up* function: first calls do one-time work (library handles,
  autotuning, ``torch.compile``, lazy allocations) that must not happen inside a capture, so the
  function runs a few times on the capture's side stream first;
* replay reads the *same addresses*: new data is copied into the buffers the graph was captured
  with (:class:`StaticInputs`); rebinding a Python name changes nothing the graph sees.

Source: PyTorch's CUDA-graph notes ("Whole-network capture"); the seed article, "Graph Time".
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

Tensor = torch.Tensor
Output = TypeVar("Output")

# Extra keyword arguments for torch.cuda.graph, set by tools that wrap captures (profiling's
# record_annotations asks for enable_annotations=True on torch >= 2.14): capture knows nothing of them.
_CAPTURE_OPTIONS: contextvars.ContextVar[tuple] = contextvars.ContextVar("capture_options", default=())


@contextmanager
def capture_options(**options: Any) -> Iterator[None]:
    """Pass ``options`` to ``torch.cuda.graph`` in every :func:`capture_graph` inside the block."""
    token = _CAPTURE_OPTIONS.set((*_CAPTURE_OPTIONS.get(), *options.items()))
    try:
        yield
    finally:
        _CAPTURE_OPTIONS.reset(token)


def capture_graph(fn: Callable[[], Output], warmup: int = 3, pool: Any = None,
                  stream: torch.cuda.Stream | None = None) -> tuple[torch.cuda.CUDAGraph, Output]:
    """Warm ``fn`` up on a side stream, then capture one call of it as a CUDA graph.

    Args:
        fn: no arguments; launches CUDA work and returns its outputs. It must read its inputs from
            tensors that outlive the graph (static buffers, parameters), never synchronise with
            the host (``.item()``, ``.cpu()``, data-dependent shapes) and launch the same work on
            every call.
        warmup: eager calls before the capture, on the capture's stream.
        pool: a ``torch.cuda.graph_pool_handle()`` (or another graph's ``pool()``) to share one
            private pool between graphs that never run at the same time.
        stream: the side stream; graphs sharing a pool should share it too (the caching allocator
            reuses a freed block only on the stream it came from).

    Captures in ``capture_error_mode="thread_local"``, so a loader thread may keep pinning batches
    meanwhile (change it with :func:`capture_options`).

    Returns:
        ``(graph, outputs)``: ``graph.replay()`` reruns the kernels and rewrites ``outputs`` in
        place (the next replay overwrites them: clone what you keep). The graph keeps ``outputs``
        alive, so their memory is never handed to anything else.
    """
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the copies that filled the static buffers
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream,
                          **{"capture_error_mode": "thread_local", **dict(_CAPTURE_OPTIONS.get())}):
        outputs = fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.captured_outputs = outputs  # alive as long as the graph can replay into them
    return graph, outputs


class StaticInputs:
    """The device buffers a captured graph reads, refilled from host batches.

    Built from a template (a mapping of tensors or a dataclass such as
    :class:`~attn_gym_lite.data.PackedBatch`): one buffer per tensor field, of its shape and dtype
    (the graph's capacity, forever). ``copy_(batch)`` copies a new batch into the same buffers
    with ``non_blocking=True``: asynchronous from pinned memory, ordered before the next replay.
    Buffers read as ``static.input_ids`` or ``static["cu_seqlens"]``.

    Source: the seed article, "A More Realistic Training Loop".
    """

    def __init__(self, template: Any, device: torch.device | str) -> None:
        self._buffers = {name: torch.empty_like(value, device=device) for name, value in _fields(template).items()}
        self.copy_(template)

    def copy_(self, batch: Any) -> None:
        """Copy every tensor field of ``batch`` into its buffer. A shape or dtype other than the
        buffer's is refused: a captured graph cannot take a new shape (pad to capacity instead)."""
        fields = _fields(batch)
        for name, buffer in self._buffers.items():
            if fields[name].shape != buffer.shape or fields[name].dtype != buffer.dtype:
                raise ValueError(f"StaticInputs.copy_: {name} must be {tuple(buffer.shape)} {buffer.dtype} "
                                 f"(the captured capacity), got {tuple(fields[name].shape)} {fields[name].dtype}")
        for name, buffer in self._buffers.items():
            buffer.copy_(fields[name], non_blocking=True)

    def __getitem__(self, name: str) -> Tensor:
        return self._buffers[name]

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.__dict__["_buffers"][name]
        except KeyError:
            raise AttributeError(name) from None

    def keys(self) -> list[str]:
        return list(self._buffers)


def _fields(batch: Any) -> dict[str, Tensor]:
    items = batch.items() if isinstance(batch, Mapping) else ((f.name, getattr(batch, f.name))
                                                               for f in dataclasses.fields(batch))
    return {name: value for name, value in items if isinstance(value, Tensor)}
