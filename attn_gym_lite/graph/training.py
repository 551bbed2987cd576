"""A training step at fixed token capacity, eager or replayed from one CUDA graph.

The recipe of the "Graph capture" chapter:

1. Allocate static device buffers at capacity (``T`` tokens, ``N + 1`` boundaries) once.
2. Capture forward + backward in one graph, with ``torch.autograd.grad`` so every parameter
   gradient is an explicit graph output at a fixed address.
3. Each step: copy the next pinned host batch into the buffers, replay, attach the graph's
   gradients to ``.grad`` and run an eager fused Adam step, which updates the parameters in place
   (the graph reads them at the same addresses next time).

Source: the seed article, "A More Realistic Training Loop".
"""

from __future__ import annotations

import torch

from ..data import PackedBatch
from ..models import PackedLM
from ..regions import mark_kernels
from .capture import StaticInputs, capture_graph

Tensor = torch.Tensor


class FixedCapacityTrainer:
    """Trains a :class:`PackedLM` on :class:`PackedBatch` es of one capacity ``(T, N)``.

    Args:
        model: the model; its parameters must already be on ``device``.
        first_batch: a batch at the capacity every later batch will have; it fixes the static
            buffers' shapes.
        use_graph: capture forward + backward as one CUDA graph (CUDA only). Without it each
            step runs eagerly and passes the batch's own ``max_seqlen`` to attention.
        max_seqlen: the bound baked into the graph; default ``T``, the only value safe for every
            batch of capacity ``T``.
        lr: Adam learning rate.

    Raises:
        ValueError: ``use_graph`` on a non-CUDA device, or ``max_seqlen`` outside ``[1, T]``.
    """

    def __init__(
        self,
        model: PackedLM,
        first_batch: PackedBatch,
        *,
        use_graph: bool,
        max_seqlen: int | None = None,
        lr: float = 1e-3,
    ) -> None:
        device = next(model.parameters()).device
        if use_graph and device.type != "cuda":
            raise ValueError(f"FixedCapacityTrainer: use_graph=True needs CUDA parameters, got {device}")
        capacity = first_batch.token_capacity
        self.max_seqlen = capacity if max_seqlen is None else max_seqlen
        if not 1 <= self.max_seqlen <= capacity:
            raise ValueError(
                f"FixedCapacityTrainer: max_seqlen must be in [1, T={capacity}], got {self.max_seqlen}"
            )
        self.model, self.use_graph = model, use_graph
        self.parameters = tuple(model.parameters())
        self.static = StaticInputs(first_batch, device)
        self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True)
        self.graph = None
        if use_graph:
            self.graph, (self._loss, self._grads) = capture_graph(self._forward_backward)

    def _forward_backward(self, max_seqlen: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        s = self.static
        loss = self.model.loss(
            s.input_ids, s.labels, s.loss_mask, s.cu_seqlens, max_seqlen or self.max_seqlen
        )
        # The seed gradient (a fill of ones) is launched here, outside the model's regions;
        # autograd's own kernels get "<region> backward" labels from the regions that made them.
        with mark_kernels("backward"):
            return loss, torch.autograd.grad(loss, self.parameters)

    def step(self, batch: PackedBatch) -> Tensor:
        """Train on one batch; returns its loss as a float32 device scalar (a fresh copy).

        No host synchronisation: the copy from pinned memory, the replay and the optimizer step
        are all queued on the current stream.
        """
        self.static.copy_(batch)
        if self.graph is not None:
            self.graph.replay()
            loss, grads = self._loss, self._grads
        else:
            loss, grads = self._forward_backward(batch.max_seqlen)
        # The graph's gradient outputs are attached, not copied: Adam reads them in place, and the
        # next replay rewrites the same storage.
        for parameter, grad in zip(self.parameters, grads):
            parameter.grad = grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()
