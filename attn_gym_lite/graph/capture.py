"""Capturing a function as a CUDA graph, and the static buffers a graph reads.

A CUDA graph records the kernels a function launches, with the exact device addresses they read
and write, and replays them later with one launch call. Two consequences shape everything here:

* Capture must see a *warmed-up* function. The first call of many ops does one-time work (cuBLAS
  handle creation, autotuning, lazy allocations) that is not allowed, or not wanted, inside a
  capture. So we run the function a few times on a side stream first.
* Replay reads the *same addresses* every time. New data has to be copied into the buffers the
  graph was captured with; binding a Python name to a new tensor changes nothing the graph sees.
  `StaticInputs` owns those buffers and does the copies.

Source: PyTorch's CUDA-graph notes ("Whole-network capture"), and the seed article, section
"Graph Time".
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from ..checks import check_bool, check_choice, check_device, check_int

Tensor = torch.Tensor
Output = TypeVar("Output")

# Extra keyword arguments for torch.cuda.graph, set by whoever wraps captures (profiling's
# record_annotations asks for enable_annotations=True on torch >= 2.14).
#: The values of ``torch.cuda.graph``'s ``capture_error_mode`` (``cudaStreamCaptureMode``).
_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")

_CAPTURE_OPTIONS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "attn_gym_lite_capture_options", default=None
)


@contextmanager
def capture_options(**options: Any) -> Iterator[None]:
    """Pass ``options`` to ``torch.cuda.graph`` in every :func:`capture_graph` inside the block.

    The hook through which tools that wrap capture (e.g.
    :func:`attn_gym_lite.profiling.record_annotations`) change it, so that capture itself knows
    nothing about them. Blocks nest; inner options win.

    Args:
        options: keyword arguments of this torch's ``torch.cuda.graph`` other than ``pool`` and
            ``stream`` (which :func:`capture_graph` sets), e.g. ``capture_error_mode`` or, on
            torch >= 2.14, ``enable_annotations``.

    Raises:
        ValueError: on entering the block, an option ``torch.cuda.graph`` does not take (or
            ``pool``/``stream``), or a ``capture_error_mode`` not in ``"global"``,
            ``"thread_local"``, ``"relaxed"``.
        TypeError: on entering the block, a non-``bool`` value for an option whose default is a
            ``bool`` (``enable_annotations``, ``check_input_liveness``).

    Source: ``torch.cuda.graph`` (its keyword arguments).
    """
    parameters = inspect.signature(torch.cuda.graph.__init__).parameters
    allowed = tuple(name for name in parameters if name not in ("self", "cuda_graph", "pool", "stream"))
    for name, value in options.items():
        check_choice("capture_options: option", name, allowed)
        if name == "capture_error_mode":
            check_choice("capture_error_mode", value, _CAPTURE_ERROR_MODES)
        elif isinstance(parameters[name].default, bool):
            check_bool(name, value)
    token = _CAPTURE_OPTIONS.set({**(_CAPTURE_OPTIONS.get() or {}), **options})
    try:
        yield
    finally:
        _CAPTURE_OPTIONS.reset(token)


def capture_graph(
    fn: Callable[[], Output],
    warmup: int = 3,
    pool: Any = None,
    stream: torch.cuda.Stream | None = None,
) -> tuple[torch.cuda.CUDAGraph, Output]:
    """Warm ``fn`` up on a side stream, then capture one call of it as a CUDA graph.

    Args:
        fn: a function of no arguments that launches CUDA work and returns its outputs (any
            structure of tensors). It must read its inputs from tensors that outlive the graph
            (static buffers, parameters), must not synchronise with the host (``.item()``,
            ``.tolist()``, ``.cpu()``, data-dependent shapes) and must launch the same work on
            every call.
        warmup: number of eager calls before capture (int >= 0). They run on the same side stream
            as the capture, so lazy initialisation (library handles, autograd buffers) happens
            outside the graph. 3 is what PyTorch's documentation uses.
        pool: a memory-pool handle from ``torch.cuda.graph_pool_handle()`` or another graph's
            ``graph.pool()``, to share one private pool between graphs that never run at the
            same time. ``None`` gives the graph a pool of its own.
        stream: the side stream to warm up and capture on; default a new one. Graphs that share
            a pool should also share this stream: the caching allocator reuses a freed block
            only for allocations on the stream it was allocated on.

    Captures in ``capture_error_mode="thread_local"``: only this thread's capture-unsafe CUDA calls
    are refused, so a loader thread may keep pinning batches meanwhile (torch's default,
    ``"global"``, refuses them in every thread). Change it with :func:`capture_options`.

    Returns:
        ``(graph, outputs)``: ``graph.replay()`` reruns the captured kernels and rewrites
        ``outputs`` in place. ``outputs`` live in the graph's private pool and are overwritten
        by the next replay; clone what you need to keep. The graph holds a reference to
        ``outputs``: were they freed, a later capture could take their memory and the next
        replay would write into it (or, after ``empty_cache``, into unmapped memory).

    Raises:
        TypeError: ``fn`` is not callable or ``warmup`` is not an int.
        ValueError: ``warmup`` is negative.
        RuntimeError: CUDA is not available, or ``fn`` did something not allowed during capture
            (the CUDA error is raised from inside ``torch.cuda.graph``).
    """
    if not callable(fn):
        raise TypeError(f"capture_graph: fn must be callable, got {type(fn).__name__}")
    check_int("warmup", warmup, minimum=0)
    if not torch.cuda.is_available():
        raise RuntimeError("capture_graph: CUDA graphs need a CUDA device; none is available")

    # The side stream isolates exactly the work we want recorded; it first waits for everything
    # already queued (e.g. the copies that filled the static buffers).
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    # "thread_local", not torch's "global": the package's loader pins the next batches in a
    # background thread, and in global mode that thread's pinned allocations (unsafe calls during
    # any capture) would fail it, or the capture, whenever they overlap. capture_options overrides.
    options = {"capture_error_mode": "thread_local", **(_CAPTURE_OPTIONS.get() or {})}
    with torch.cuda.graph(graph, pool=pool, stream=stream, **options):
        outputs = fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.captured_outputs = outputs  # keeps them allocated for as long as the graph can replay
    return graph, outputs


class StaticInputs:
    """The fixed-capacity device buffers a captured graph reads, refilled from host batches.

    Built from a template batch: every tensor field gets one device buffer of the same shape and
    dtype. ``copy_(batch)`` copies a new batch into those same buffers with
    ``non_blocking=True``: from pinned host memory the copy is asynchronous and ordered on the
    current stream before the next ``graph.replay()``. From pageable memory it is still correct,
    only not overlapped with host work.

    The buffers are reachable as attributes or items: ``static.input_ids``,
    ``static["cu_seqlens"]``.

    Args:
        template: a mapping ``name -> Tensor`` or a dataclass instance (e.g.
            :class:`attn_gym_lite.data.PackedBatch`); only its tensor fields are kept. Shapes
            and dtypes are fixed from it forever: they are the graph's capacity.
        device: where the buffers live (``"cuda"`` for graphs; a CPU device works too, so the
            same training code runs eagerly on CPU).

    Raises:
        TypeError: ``template`` is neither a mapping nor a dataclass instance, or holds no
            tensors.
        ValueError: a tensor field of ``template`` is a meta tensor (see :meth:`copy_`);
            ``device`` is one torch does not parse, one this host does not have (``"cuda"``
            without a GPU) or ``"meta"`` (buffers that hold no values;
            :func:`~attn_gym_lite.checks.check_device`).
        TypeError: ``device`` is not a str, int or ``torch.device``.
        AttributeError / KeyError: ``static.name`` / ``static["name"]`` names no buffer (the
            message lists the buffers).

    Source: the seed article, "A More Realistic Training Loop" (static buffers filled from
    pinned batches).
    """

    def __init__(self, template: Any, device: torch.device | str) -> None:
        fields = _tensor_fields(template, "template")
        if not fields:
            raise TypeError("StaticInputs: template must hold at least one Tensor field, got none")
        self.device = check_device("device", device, allow_meta=False)
        self._buffers: dict[str, Tensor] = {
            name: torch.empty_like(value, device=self.device) for name, value in fields.items()
        }
        self.copy_(template)

    def copy_(self, batch: Any) -> None:
        """Copy every tensor field of ``batch`` into the matching static buffer.

        Raises:
            ValueError: a field is missing, or its shape or dtype differs from the buffer's (a
                captured graph cannot take a new shape: pad the batch to capacity instead), or
                it is a meta tensor (no values to copy). Nothing is copied when any field is wrong.
        """
        fields = _tensor_fields(batch, "batch")
        for name, buffer in self._buffers.items():
            if name not in fields:
                raise ValueError(f"StaticInputs.copy_: batch has no tensor field {name!r}")
            value = fields[name]
            if value.shape != buffer.shape or value.dtype != buffer.dtype:
                raise ValueError(
                    f"StaticInputs.copy_: field {name!r} must have shape {tuple(buffer.shape)} "
                    f"and dtype {buffer.dtype} (the captured capacity), "
                    f"got shape {tuple(value.shape)} and dtype {value.dtype}"
                )
            if value.is_meta:  # checked with the rest: the copy would fail after earlier fields were copied
                raise ValueError(
                    f"StaticInputs.copy_: field {name!r} must hold values (it is copied into the buffer), "
                    f"got a meta tensor of shape {tuple(value.shape)}"
                )
        for name, buffer in self._buffers.items():
            buffer.copy_(fields[name], non_blocking=True)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._buffers:  # the attribute form's message, not a bare KeyError
            raise KeyError(f"StaticInputs has no buffer {name!r}; it has {sorted(self._buffers)}")
        return self._buffers[name]

    def __getattr__(self, name: str) -> Tensor:
        buffers = self.__dict__.get("_buffers", {})
        if name in buffers:
            return buffers[name]
        raise AttributeError(f"StaticInputs has no buffer {name!r}; it has {sorted(buffers)}")

    def keys(self) -> list[str]:
        """Names of the buffers, in template order."""
        return list(self._buffers)


def _tensor_fields(batch: Any, argument: str) -> dict[str, Tensor]:
    if isinstance(batch, Mapping):
        items = batch.items()
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = ((f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch))
    else:
        raise TypeError(
            f"StaticInputs: {argument} must be a mapping of tensors or a dataclass instance, "
            f"got {type(batch).__name__}"
        )
    return {name: value for name, value in items if isinstance(value, Tensor)}
