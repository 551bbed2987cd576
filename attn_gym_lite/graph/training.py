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
from torch import nn

from ..checks import check_int, check_real
from ..data import PackedBatch
from ..regions import mark_kernels
from .capture import StaticInputs, capture_graph

Tensor = torch.Tensor


class FixedCapacityTrainer:
    """Trains a packed language model on :class:`PackedBatch` es of one capacity ``(T, N)``.

    The graph's key is ``(T, N)`` and, where the model's attention sizes its work by a host
    ``max_seqlen`` (``model.needs_max_seqlen``: torch's ``varlen_attn``, or the Triton ``"rect"``
    schedule), the ``max_seqlen`` it was captured with: :meth:`step` refuses a batch whose longest
    sequence exceeds it instead of training on a grid that silently skips rows. The package's
    default attention reads the work from ``cu_seqlens`` on the device and has no such bound.

    Args:
        model: an ``nn.Module`` with ``loss(input_ids, labels, loss_mask, cu_seqlens, max_seqlen)``
            returning a scalar (:class:`~attn_gym_lite.models.PackedLM`,
            :class:`~attn_gym_lite.models.PackedTransformer`); its parameters on the device to
            train on.
        first_batch: a batch at the capacity every later batch will have; it fixes the static
            buffers' shapes.
        use_graph: capture forward + backward as one CUDA graph (CUDA only). Without it each
            step runs eagerly and passes the batch's own ``max_seqlen`` to attention.
        max_seqlen: the bound baked into the graph where the model needs one; default ``T``, the
            only value safe for every batch of capacity ``T``.
        lr: Adam learning rate.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` with a ``loss`` method.
        ValueError: ``use_graph`` on a non-CUDA device, or ``max_seqlen`` outside ``[1, T]``.
    """

    def __init__(
        self,
        model: nn.Module,
        first_batch: PackedBatch,
        *,
        use_graph: bool,
        max_seqlen: int | None = None,
        lr: float = 1e-3,
    ) -> None:
        if not isinstance(model, nn.Module) or not callable(getattr(model, "loss", None)):
            raise TypeError(f"model must be an nn.Module with a loss(...) method, got {type(model).__name__}")
        device = next(model.parameters()).device
        if use_graph and device.type != "cuda":
            raise ValueError(f"FixedCapacityTrainer: use_graph=True needs CUDA parameters, got {device}")
        capacity = first_batch.token_capacity
        self.max_seqlen = check_int("max_seqlen", capacity if max_seqlen is None else max_seqlen,
                                    minimum=1, maximum=capacity)
        self.needs_max_seqlen = bool(getattr(model, "needs_max_seqlen", False))
        check_real("lr", lr, minimum=0)
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
        are all queued on the current stream. The batch's longest sequence is a host int
        (``batch.max_seqlen``), so checking it against the graph's key costs nothing.

        Raises:
            ValueError: the batch does not have the captured capacity, or (where the model needs
                a ``max_seqlen``) its longest sequence exceeds the one the graph was captured with.
        """
        if self.graph is not None and self.needs_max_seqlen and batch.max_seqlen > self.max_seqlen:
            raise ValueError(
                f"batch.max_seqlen must be <= the max_seqlen = {self.max_seqlen} the graph was captured with "
                f"(the attention's grid is sized by it), got {batch.max_seqlen}; capture with a larger max_seqlen "
                "(T is always safe) or use an attention that reads the layout on the device"
            )
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
