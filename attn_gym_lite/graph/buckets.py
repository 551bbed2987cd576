"""Graph buckets: a few CUDA graphs of different token capacity sharing one memory pool.

One graph captured at capacity ``T`` runs every token-parallel op (projections, norms, the loss) on
all ``T`` rows however few are real. Capturing a handful of capacities and replaying the smallest
that holds ``L`` removes most of that tax, *if* the graphs do not multiply memory. vLLM's recipe:

* capture the largest capacity first, every graph into one pool: a smaller graph's intermediates
  reuse the blocks the larger one freed (buckets never run at the same time);
* give every graph prefix views ``[:capacity]`` of one set of max-sized input and output buffers;
* choose the bucket on the host from the ``L`` the loader already knows (reading
  ``cu_seqlens[-1]`` would be a device-to-host sync).

Sharing a pool shares lifetimes: an output is valid only until the next replay of *any* bucket.
``copy_out=True`` hands out clones; ``debug=True`` hands out views that raise once stale.

Source: the seed article, "Could we use more than one graph?", "Pools and Pools of Memory" and
"Crossing graph boundaries".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import torch

from ..data.capacity import select_bucket
from .capture import capture_graph

Tensor = torch.Tensor


class StaleOutputError(RuntimeError):
    """An output of an older replay was read after a newer replay overwrote it."""


class _Guarded(Tensor):
    """A view of a graph output that refuses to be used once a newer replay has happened."""

    @classmethod
    def wrap(cls, tensor: Tensor, owner: GraphBuckets, generation: int) -> Tensor:
        guarded = tensor.as_subclass(cls)
        guarded._owner, guarded._generation = owner, generation
        return guarded

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for value in itertools.chain(args, (kwargs or {}).values()):
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, _Guarded) and item._generation != item._owner.generation:
                    raise StaleOutputError(f"GraphBuckets: this output of replay #{item._generation} was "
                                           f"overwritten by replay #{item._owner.generation}; clone() what you keep")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class GraphBuckets:
    """One CUDA graph per token capacity, captured largest first into one shared pool.

    Args:
        fn: ``fn(inputs) -> tensor or tuple of tensors``; ``inputs`` maps names to token inputs as
            ``[capacity, ...]`` prefix views and fixed inputs whole. An output whose first dimension
            follows the capacity (probed eagerly at the largest and smallest) is a *token output*,
            cut to the bucket's capacity; the others (a loss, gradients) keep one shape.
        capacities: token capacities (positive ints).
        token_inputs: name -> template ``[T_max, ...]``, ``T_max`` the largest capacity. Its values
            are copied into the backing buffer and the graphs are warmed up and captured on them,
            so they must be valid inputs (a first real batch). ``fn`` must be safe on them at every
            capacity: clamp a ``cu_seqlens`` that runs past a small bucket.
        fixed_inputs: name -> template shared by every bucket (``cu_seqlens [N + 1]``).
        token_outputs: one bool per output, overriding the probe.
        copy_out: ``replay`` returns clones the caller owns.
        debug: ``replay`` returns views that raise :class:`StaleOutputError` once a later replay
            has overwritten them.
        warmup: eager calls per bucket before its capture.
        max_seqlen: the bound ``fn`` bakes into its graphs if its attention sizes its grid by one;
            :meth:`replay` then refuses a batch whose longest sequence exceeds it.
    """

    def __init__(self, fn: Callable[[dict[str, Tensor]], Tensor | tuple[Tensor, ...]], capacities: Sequence[int], *,
                 token_inputs: Mapping[str, Tensor], fixed_inputs: Mapping[str, Tensor] | None = None,
                 token_outputs: Sequence[bool] | None = None, copy_out: bool = False, debug: bool = False,
                 warmup: int = 3, max_seqlen: int | None = None) -> None:
        self.capacities = tuple(sorted(set(capacities)))
        for name, template in token_inputs.items():
            if template.shape[0] != self.capacities[-1]:
                raise ValueError(f"GraphBuckets: token input {name!r} must have T_max = {self.capacities[-1]} "
                                 f"rows (the largest capacity), got {tuple(template.shape)}")
        self.copy_out, self.debug, self.max_seqlen = copy_out, debug, max_seqlen
        self.generation = 0
        # One set of backing buffers, outside the pool; every bucket sees prefix views of them.
        self.token_inputs = {n: t.detach().to("cuda", copy=True) for n, t in token_inputs.items()}
        self.fixed_inputs = {n: t.detach().to("cuda", copy=True) for n, t in (fixed_inputs or {}).items()}
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: tuple[Tensor, ...] = ()
        self._token_output = None if token_outputs is None else tuple(token_outputs)
        for capacity in reversed(self.capacities):  # largest first
            self._capture(fn, capacity, warmup)

    def inputs(self, capacity: int) -> dict[str, Tensor]:
        """The views bucket ``capacity`` reads: token inputs ``[:capacity]``, fixed inputs whole."""
        return {**{name: buffer[:capacity] for name, buffer in self.token_inputs.items()}, **self.fixed_inputs}

    def _capture(self, fn, capacity: int, warmup: int) -> None:
        views = self.inputs(capacity)
        if not self._outputs:  # the largest bucket: size the shared output buffers from an eager call
            probe = fn(views)
            self.returns_tuple = isinstance(probe, tuple)
            probe = probe if self.returns_tuple else (probe,)
            self._outputs = tuple(torch.empty_like(t.detach()) for t in probe)
            if self._token_output is None:  # a token output follows the capacity down to the smallest
                small = fn(self.inputs(self.capacities[0]))
                small = small if isinstance(small, tuple) else (small,)
                self._token_output = tuple(t.dim() > 0 and t.shape[0] == capacity and s.shape[0] == self.capacities[0]
                                           for t, s in zip(probe, small))
                del small
            # The probes' autograd graphs must be gone before the capture: a live one keeps the
            # parameters' gradient-accumulation nodes on the stream the probe ran on (the default
            # one), and the captured backward would then make that stream wait on the capture.
            del probe

        def captured() -> None:
            result = fn(views)
            for value, buffer, token in zip(result if isinstance(result, tuple) else (result,), self._outputs,
                                            self._token_output):
                # Into the shared buffer, so every bucket's outputs live at one address outside the
                # pool; no_grad, or the copy would keep this capture's activations alive in the pool.
                with torch.no_grad():
                    (buffer[:capacity] if token else buffer).copy_(value)

        # One side stream for every capture: a freed block of the pool is reused only on its stream.
        self.graphs[capacity], _ = capture_graph(captured, warmup=warmup, pool=self.pool, stream=self.stream)

    def replay(self, batch: Mapping[str, Tensor], active_tokens: int,
               max_seqlen: int | None = None) -> Tensor | tuple[Tensor, ...]:
        """Copy ``batch`` (token inputs with at least the bucket's rows, fixed inputs) into the
        bucket that holds ``active_tokens`` (``L``, a host int) and replay it. Outputs are valid
        until the next replay of any bucket unless ``copy_out``."""
        capacity = select_bucket(self.capacities, active_tokens)
        if self.max_seqlen is not None and (max_seqlen is None or max_seqlen > self.max_seqlen):
            raise ValueError(f"max_seqlen must be the batch's longest sequence, <= the captured {self.max_seqlen}, "
                             f"got {max_seqlen}")
        for name, buffer in self.token_inputs.items():
            buffer[:capacity].copy_(batch[name][:capacity], non_blocking=True)
        for name, buffer in self.fixed_inputs.items():
            buffer.copy_(batch[name], non_blocking=True)
        self.graphs[capacity].replay()
        self.generation += 1
        outputs = tuple(buffer[:capacity] if token else buffer for buffer, token in zip(self._outputs, self._token_output))
        if self.copy_out:
            outputs = tuple(t.clone() for t in outputs)
        elif self.debug:
            outputs = tuple(_Guarded.wrap(t, self, self.generation) for t in outputs)
        return outputs if self.returns_tuple else outputs[0]


def private_pool_bytes(pool) -> int:
    """Bytes the caching allocator holds for graph pool ``pool`` (``torch.cuda.memory_snapshot``'s
    segments of that pool id). Eager only."""
    return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment.get("segment_pool_id", ())) == tuple(pool))
