"""Graph buckets: a few CUDA graphs of different token capacity sharing one memory pool.

One graph captured at token capacity ``T`` runs every token-parallel op (projections, norms, the
loss) on all ``T`` rows, however few are real: at ``L = T / 16`` a projection does 16x the needed
work. Capturing a handful of capacities and replaying the smallest one that holds ``L`` removes
most of that tax, *if* the graphs do not multiply memory. The recipe (vLLM's, applied to training):

* capture the largest capacity first, every graph into one pool
  (``torch.cuda.graph_pool_handle()``): intermediates of a smaller graph reuse blocks the larger
  one freed, since buckets never run at the same time;
* give every graph the same static inputs and outputs: prefix views ``[:capacity]`` of one set of
  max-sized backing buffers, so the addresses a bucket reads and writes are shared;
* choose the bucket on the host from the active-token count the loader already knows; reading
  ``cu_seqlens[-1]`` for it would be a device-to-host sync.

Sharing a pool shares lifetimes: an output is valid only until the next replay of *any* bucket.
``GraphBuckets`` makes that explicit (``copy_out=True``) or checks it (``debug=True``).

Source: the seed article, sections "Could we use more than one graph?", "Pools and Pools of
Memory" and "Crossing graph boundaries".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from ..checks import check_bool, check_int, check_int_sequence
from ..data.capacity import select_bucket
from .capture import capture_graph

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------
# Capturing and replaying the buckets
# ---------------------------------------------------------------------------------------------


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
                    raise StaleOutputError(
                        f"GraphBuckets: this output came from replay #{item._generation}, but replay "
                        f"#{item._owner.generation} has since overwritten it; clone() outputs you keep, "
                        "or construct GraphBuckets with copy_out=True"
                    )
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class GraphBuckets:
    """One CUDA graph per token capacity, captured largest first into one shared pool.

    Args:
        fn: ``fn(inputs) -> outputs``: ``inputs`` maps names to tensors (token inputs as
            ``[capacity, ...]`` prefix views, fixed inputs whole); ``outputs`` is a tensor or a
            tuple of tensors. An output whose first dimension follows the capacity (``T_max`` in
            the largest bucket, the capacity in the smallest; both are probed eagerly) is a
            *token output*; any other output must have the same shape in every bucket (e.g. a
            loss, parameter gradients).
        capacities: token capacities (positive ints, any order; duplicates are dropped).
        token_inputs: name -> template tensor ``[T_max, ...]``; ``T_max`` must equal the largest
            capacity. Its shape, dtype and *values* are copied into the backing buffer: the
            warm-up and capture calls read them, so they must be valid inputs (in-range token
            ids and labels, say: a first real batch).
        fixed_inputs: name -> template tensor shared by every bucket (e.g. ``cu_seqlens [N + 1]``),
            copied the same way. Every bucket is warmed up and captured on these values, so
            ``fn`` must be safe on them at every capacity: a ``cu_seqlens`` that runs past a small
            bucket's capacity makes attention read out of bounds unless ``fn`` clamps it
            (``cu_seqlens.clamp(max=capacity)``, a no-op for a batch that fits).
        token_outputs: one bool per output, overriding the rule above (for a fixed output whose
            first dimension happens to equal ``T_max``).
        copy_out: ``replay`` returns clones the caller owns instead of views of the shared
            output buffers.
        debug: ``replay`` returns guarded views that raise :class:`StaleOutputError` when used
            after a later replay (costs a Python check per op on them; for debugging).
        warmup: eager calls per bucket before its capture.
        max_seqlen: the ``max_seqlen`` bound ``fn`` bakes into its graphs, if its attention sizes its
            work by one (torch's ``varlen_attn``, the Triton ``"rect"`` schedule); part of every
            bucket's key. :meth:`replay` then needs each batch's longest sequence and refuses one
            past the bound. ``None`` (the package's default attention) for no such bound.

    Raises:
        ValueError: bad capacities, a token input whose first dimension is not the largest
            capacity, or outputs whose shapes differ between buckets in another way; ``copy_out``
            and ``debug`` both True; ``warmup`` < 0.
        TypeError: ``fn`` not callable; ``token_inputs`` not a non-empty mapping of str to
            tensors, ``fixed_inputs`` neither ``None`` nor such a mapping; ``copy_out`` or
            ``debug`` not a bool; ``warmup`` not an int; ``token_outputs`` neither ``None`` nor
            a sequence of bools. All checked before anything is allocated or ``fn`` runs.
        RuntimeError: CUDA is not available.
    """

    def __init__(
        self,
        fn: Callable[[dict[str, Tensor]], Tensor | tuple[Tensor, ...]],
        capacities: Sequence[int],
        *,
        token_inputs: Mapping[str, Tensor],
        fixed_inputs: Mapping[str, Tensor] | None = None,
        token_outputs: Sequence[bool] | None = None,
        copy_out: bool = False,
        debug: bool = False,
        warmup: int = 3,
        max_seqlen: int | None = None,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("GraphBuckets: CUDA graphs need a CUDA device; none is available")
        self.capacities = _check_capacities(capacities)
        largest = self.capacities[-1]
        # Every argument before anything is allocated or fn runs. Before: copy_out="no" acted as
        # True, copy_out=True silently dropped debug=True, a list of token inputs raised
        # AttributeError ('items'), and warmup and token_outputs were checked only after fn had run.
        if not callable(fn):
            raise TypeError(f"GraphBuckets: fn must be callable, got {type(fn).__name__}")
        for argument, mapping, required in (("token_inputs", token_inputs, True), ("fixed_inputs", fixed_inputs, False)):
            if mapping is None and not required:
                continue
            if not isinstance(mapping, Mapping) or (required and not mapping):
                raise TypeError(f"GraphBuckets: {argument} must be a {'non-empty ' if required else ''}mapping of "
                                f"name (str) to tensor, got {type(mapping).__name__}: {mapping!r:.60}")
            for name, tensor in mapping.items():
                if not isinstance(name, str) or not isinstance(tensor, Tensor):
                    raise TypeError(f"GraphBuckets: {argument} must map names (str) to tensors, got {name!r}: "
                                    f"{type(tensor).__name__}")
        copy_out, debug = check_bool("copy_out", copy_out), check_bool("debug", debug)
        if copy_out and debug:
            raise ValueError("GraphBuckets: copy_out and debug are alternatives (owned clones, or guarded views "
                             "of the shared buffers), got both True")
        warmup = check_int("warmup", warmup, minimum=0)
        if token_outputs is not None:
            # A sequence of bools: Python's, numpy's (a bool array, or a list of np.bool_), not 1/0.
            flags = token_outputs.tolist() if isinstance(token_outputs, np.ndarray) else token_outputs
            if isinstance(flags, (str, bytes)) or not isinstance(flags, Sequence) or not all(
                    isinstance(flag, (bool, np.bool_)) for flag in flags):
                raise TypeError(f"GraphBuckets: token_outputs must be None or a sequence of bools, got {token_outputs!r:.60}")
            token_outputs = tuple(bool(flag) for flag in flags)
        for name, template in token_inputs.items():
            if template.dim() == 0 or template.shape[0] != largest:
                raise ValueError(
                    f"GraphBuckets: token input {name!r} must have first dimension T_max = {largest} "
                    f"(the largest capacity), got shape {tuple(template.shape)}"
                )
        self.copy_out, self.debug = copy_out, debug
        self.max_seqlen = None if max_seqlen is None else check_int("max_seqlen", max_seqlen, minimum=1)
        self.generation = 0
        # One set of backing buffers, allocated outside the pool: every bucket sees prefix views.
        # They start as copies of the templates: uninitialised token ids would send the warm-up's
        # embedding lookup out of range (a device-side assert).
        self.token_inputs = {n: t.detach().to("cuda", copy=True) for n, t in token_inputs.items()}
        self.fixed_inputs = {n: t.detach().to("cuda", copy=True) for n, t in (fixed_inputs or {}).items()}
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: tuple[Tensor, ...] = ()
        self._token_output = token_outputs  # None, or the tuple of bools checked above
        self.returns_tuple = True
        for capacity in reversed(self.capacities):  # largest first
            self._capture(fn, capacity, warmup)

    def inputs(self, capacity: int) -> dict[str, Tensor]:
        """The views bucket ``capacity`` reads: token inputs ``[:capacity]``, fixed inputs whole."""
        views = {name: buffer[:capacity] for name, buffer in self.token_inputs.items()}
        views.update(self.fixed_inputs)
        return views

    def _capture(self, fn, capacity: int, warmup: int) -> None:
        views = self.inputs(capacity)
        if not self._outputs:  # largest bucket: size the output buffers from eager calls
            probe = fn(views)
            self.returns_tuple = isinstance(probe, tuple)
            probe = probe if self.returns_tuple else (probe,)
            self._outputs = tuple(torch.empty_like(t.detach()) for t in probe)
            if self._token_output is None:
                # A token output follows the capacity: compare with the smallest bucket, so a
                # fixed output whose first dimension merely equals T_max is not mistaken for one.
                small = self.capacities[0]
                other = fn(self.inputs(small))
                other = other if isinstance(other, tuple) else (other,)
                self._token_output = tuple(
                    t.dim() > 0 and t.shape[0] == capacity and (small == capacity or o.shape[0] == small)
                    for t, o in zip(probe, other)
                )
                del other
            elif len(self._token_output) != len(probe):
                raise ValueError(
                    f"GraphBuckets: token_outputs has {len(self._token_output)} entries but fn "
                    f"returned {len(probe)} outputs"
                )
            del probe

        def captured() -> None:
            result = fn(views)
            result = result if isinstance(result, tuple) else (result,)
            if len(result) != len(self._outputs):
                raise ValueError(
                    f"GraphBuckets: fn returned {len(result)} outputs at capacity {capacity}, "
                    f"but {len(self._outputs)} at the largest capacity"
                )
            for index, (value, buffer, token) in enumerate(zip(result, self._outputs, self._token_output)):
                target = buffer[:capacity] if token else buffer
                if value.shape != target.shape:
                    raise ValueError(
                        f"GraphBuckets: output {index} has shape {tuple(value.shape)} at capacity "
                        f"{capacity}; expected {tuple(target.shape)}"
                    )
                # The graph writes its result into the shared buffer, so every bucket's output
                # lives at one address outside the pool. Without no_grad the copy would record
                # autograd history on the buffer and keep this capture's activations alive in the
                # pool, where the next bucket could not reuse them.
                with torch.no_grad():
                    target.copy_(value)

        # One side stream for every capture: freed blocks of the shared pool are reusable only
        # by allocations on the stream they came from.
        graph, _ = capture_graph(captured, warmup=warmup, pool=self.pool, stream=self.stream)
        self.graphs[capacity] = graph

    def replay(
        self, batch: Mapping[str, Tensor], active_tokens: int, max_seqlen: int | None = None
    ) -> Tensor | tuple[Tensor, ...]:
        """Copy ``batch`` into the bucket for ``active_tokens`` and replay it.

        Args:
            batch: every token input (first dimension ``>= capacity``, typically ``T_max``:
                only the first ``capacity`` rows are copied) and every fixed input, with the
                templates' dtypes; host tensors should be pinned for an asynchronous copy.
            active_tokens: ``L`` for this batch, as a host int.
            max_seqlen: the batch's longest sequence, as a host int; required when the buckets
                were captured with a ``max_seqlen`` bound.

        Returns:
            The outputs (token outputs cut to the bucket's capacity), valid until the next
            ``replay`` unless ``copy_out`` is set.

        Raises:
            ValueError: unknown or missing names, ``active_tokens`` out of range, or ``max_seqlen``
                missing or past the captured bound. Nothing is copied then.
        """
        capacity = select_bucket(self.capacities, active_tokens)
        if self.max_seqlen is not None:
            if max_seqlen is None:
                raise ValueError(
                    f"max_seqlen must be the batch's longest sequence (an int) for buckets captured with "
                    f"max_seqlen = {self.max_seqlen}, got None"
                )
            if check_int("max_seqlen", max_seqlen, minimum=0) > self.max_seqlen:
                raise ValueError(
                    f"max_seqlen must be <= the max_seqlen = {self.max_seqlen} the buckets were captured with, "
                    f"got {max_seqlen}"
                )
        expected = set(self.token_inputs) | set(self.fixed_inputs)
        if set(batch) != expected:
            raise ValueError(f"GraphBuckets.replay: batch must have exactly the inputs {sorted(expected)}, got {sorted(batch)}")
        for name, buffer in self.token_inputs.items():
            buffer[:capacity].copy_(batch[name][:capacity], non_blocking=True)
        for name, buffer in self.fixed_inputs.items():
            buffer.copy_(batch[name], non_blocking=True)
        self.graphs[capacity].replay()
        self.generation += 1
        outputs = tuple(
            buffer[:capacity] if token else buffer for buffer, token in zip(self._outputs, self._token_output)
        )
        if self.copy_out:
            outputs = tuple(t.clone() for t in outputs)
        elif self.debug:
            outputs = tuple(_Guarded.wrap(t, self, self.generation) for t in outputs)
        return outputs if self.returns_tuple else outputs[0]


def private_pool_bytes(pool) -> int:
    """Bytes the caching allocator has reserved for graph pool ``pool`` (a
    ``torch.cuda.graph_pool_handle()`` or ``graph.pool()``), summed over its segments in
    ``torch.cuda.memory_snapshot()``. Eager only (the snapshot is a host call).

    Returns:
        Bytes (``total_size`` of the pool's segments); 0 for a pool that holds none.

    Raises:
        TypeError: ``pool`` is not a sequence of ints (a handle is a pair of ints).
        ValueError: ``pool`` does not hold exactly 2 ints (checked after the TypeError cases).
        RuntimeError: CUDA is not available (there is no snapshot to read).

    Source: ``torch.cuda.memory_snapshot`` (its ``segment_pool_id`` field).
    """
    handle = check_int_sequence("pool", pool)
    if len(handle) != 2:
        raise ValueError(f"pool must be a graph pool handle of 2 ints, got {len(handle)} ints {tuple(handle)}")
    if not torch.cuda.is_available():
        raise RuntimeError("private_pool_bytes reads torch.cuda.memory_snapshot(), but CUDA is not available")
    return sum(
        segment["total_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", ())) == tuple(handle)
    )


def _check_capacities(capacities: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(set(check_int_sequence("capacities", capacities, minimum=1))))
