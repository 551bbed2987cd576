"""A training step at fixed token capacity: eager, replayed from one CUDA graph, or from graph buckets.

The recipe (chapters "Graph capture" and "Putting it together"):

1. static device buffers at capacity (``T`` token rows, ``N + 1`` boundaries), allocated once;
2. forward + backward captured in one graph, with ``torch.autograd.grad`` so that every parameter
   gradient is a graph output at a fixed address; optionally the loss ``torch.compile`` d first,
   compiled during the warm-up before the capture (the package's kernels are torch ops, so
   inductor fuses everything around them);
3. each step: copy the next pinned batch into the buffers, replay, attach the gradients as
   ``.grad`` and run an eager fused Adam, which updates the parameters in place.

With ``capacities`` the step is captured once per token capacity into one shared pool
(:class:`~attn_gym_lite.graph.buckets.GraphBuckets`) and each batch replays the smallest bucket
that holds its ``L``.

Source: the seed article, "A More Realistic Training Loop" and "Could we use more than one graph?".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..data import PackedBatch
from ..regions import mark_kernels
from .buckets import GraphBuckets
from .capture import StaticInputs, capture_graph

Tensor = torch.Tensor

FIELDS = ("input_ids", "labels", "loss_mask", "cu_seqlens")


class FixedCapacityTrainer:
    """Trains a packed language model on :class:`PackedBatch` es of one capacity ``(T, N)``.

    Args:
        model: an ``nn.Module`` with ``loss(input_ids, labels, loss_mask, cu_seqlens, max_seqlen)``
            (:class:`~attn_gym_lite.models.PackedTransformer`), on the device to train on.
        first_batch: a batch at the capacity every later batch has; it sizes the static buffers,
            and the graphs are warmed up and captured on it (no parameter is updated then).
        use_graph: capture the step (CUDA only); else run it eagerly.
        capacities: token capacities of graph buckets, the largest ``T``; ``None``: one graph.
        compile: ``torch.compile`` the model's loss (compiled during the warm-up, before capture).
        max_seqlen: the bound baked into the graphs where the attention sizes its grid by one
            (``model.needs_max_seqlen``); default ``T``, the only value safe for every batch.
        lr: Adam's learning rate.

    The graph's key is ``(T, N)`` and, where the attention reads one, ``max_seqlen``: :meth:`step`
    refuses a batch outside it rather than replay a grid that silently skips rows.
    """

    def __init__(self, model: nn.Module, first_batch: PackedBatch, *, use_graph: bool,
                 capacities: Sequence[int] | None = None, compile: bool = False, max_seqlen: int | None = None,
                 lr: float = 1e-3) -> None:
        self.model, self.use_graph = model, use_graph
        self.capacity = (first_batch.token_capacity, first_batch.sequence_capacity)
        self.max_seqlen = max_seqlen or first_batch.token_capacity
        self.needs_max_seqlen = bool(getattr(model, "needs_max_seqlen", False))
        self.loss = torch.compile(model.loss) if compile else model.loss
        self.parameters = tuple(p for p in model.parameters() if p.requires_grad)
        self.device = self.parameters[0].device
        self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=self.device.type == "cuda")
        self.graph = self.buckets = self.static = None
        capacities = sorted(set(capacities or [])) or None
        if capacities and capacities[-1] != first_batch.token_capacity:
            raise ValueError(f"capacities must end at the batch capacity T = {first_batch.token_capacity}, "
                             f"got {capacities}")
        if use_graph and (capacities is None or len(capacities) == 1):
            self.static = StaticInputs(first_batch, self.device)
            self.graph, self._outputs = capture_graph(lambda: self._forward_backward(self.static, self.max_seqlen))
        elif use_graph:
            self.buckets = GraphBuckets(self._bucket_step, capacities,
                                        token_inputs={n: getattr(first_batch, n) for n in FIELDS[:3]},
                                        fixed_inputs={"cu_seqlens": first_batch.cu_seqlens},
                                        token_outputs=[False] * (1 + len(self.parameters)))

    @property
    def graph_gradients(self) -> tuple[Tensor, ...]:
        """The one captured graph's gradient outputs: every replay rewrites them in place."""
        return self._outputs[1]

    def _forward_backward(self, inputs, max_seqlen: int) -> tuple[Tensor, tuple[Tensor, ...]]:
        loss = self.loss(*(inputs[n] for n in FIELDS), max_seqlen)
        with mark_kernels("backward"):
            # materialize_grads: a parameter the loss does not reach (a batch of no real tokens
            # through the reference attention) gets the zero gradient a replay computes for it.
            return loss, torch.autograd.grad(loss, self.parameters, allow_unused=True, materialize_grads=True)

    def _bucket_step(self, inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
        # Every bucket is warmed up and captured on the first batch, whose sequences may run past a
        # small bucket: clamped boundaries keep attention inside its rows (a no-op on every batch
        # that bucket replays).
        capacity = inputs["input_ids"].shape[0]
        inputs = {**inputs, "cu_seqlens": inputs["cu_seqlens"].clamp(max=capacity)}
        loss, grads = self._forward_backward(inputs, min(self.max_seqlen, capacity))
        return (loss, *grads)

    def step(self, batch: PackedBatch) -> Tensor:
        """Train on one batch and return its loss (a device scalar). No host synchronisation."""
        # (1) The graph's key: the capacity, and the bound a rectangular grid was sized by.
        if (batch.token_capacity, batch.sequence_capacity) != self.capacity:
            raise ValueError(f"batch must have the trainer's capacity (T, N) = {self.capacity}, "
                             f"got {(batch.token_capacity, batch.sequence_capacity)}")
        if self.use_graph and self.needs_max_seqlen and batch.max_seqlen > self.max_seqlen:
            raise ValueError(f"batch.max_seqlen must be <= the captured max_seqlen {self.max_seqlen}, "
                             f"got {batch.max_seqlen}")
        if not all(p.requires_grad for p in self.parameters):  # a replay would still update it
            raise ValueError("a parameter was frozen after the trainer was built: build a new trainer")
        if self.graph is not None:  # (2) one graph: copy into its buffers, replay
            self.static.copy_(batch)
            self.graph.replay()
            loss, grads = self._outputs
        elif self.buckets is not None:  # (3) buckets: the smallest capacity that holds L
            loss, *grads = self.buckets.replay({n: getattr(batch, n) for n in FIELDS}, batch.active_tokens)
        else:  # (4) eager, the same step on the same T rows
            inputs = {n: getattr(batch, n).to(self.device, non_blocking=True) for n in FIELDS}
            loss, grads = self._forward_backward(inputs, max(batch.max_seqlen, 1))
        for parameter, grad in zip(self.parameters, grads):  # (5) attached, not copied: Adam reads them in place
            parameter.grad = grad
        self.optimizer.step()  # (6) in place: the graph reads the parameters at the same addresses
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()
