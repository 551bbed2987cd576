"""A training step at fixed token capacity: eager, replayed from one CUDA graph, or from graph buckets.

The recipe of the "Graph capture" chapter:

1. Allocate static device buffers at capacity (``T`` tokens, ``N + 1`` boundaries) once.
2. Capture forward + backward in one graph, with ``torch.autograd.grad`` so every parameter
   gradient is an explicit graph output at a fixed address.
3. Each step: copy the next pinned host batch into the buffers, replay, attach the graph's
   gradients to ``.grad`` and run an eager fused Adam step, which updates the parameters in place
   (the graph reads them at the same addresses next time).

With ``capacities`` the same step is captured once per token capacity into one shared pool
(:class:`~attn_gym_lite.graph.buckets.GraphBuckets`, chapter "Graph buckets"), and each batch
replays the smallest bucket that holds its ``L``.

Source: the seed article, "A More Realistic Training Loop" and "Could we use more than one graph?".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..checks import check_bool, check_choice, check_int, check_int_sequence, check_real
from ..data import PackedBatch
from ..regions import mark_kernels
from .buckets import GraphBuckets
from .capture import StaticInputs, capture_graph

Tensor = torch.Tensor

_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask")


def check_model_parameters(model: nn.Module) -> torch.device:
    """The one device of ``model``'s parameters, refusing a model a trainer cannot step: no
    parameter that requires a gradient (``next(model.parameters())`` raised a bare
    ``StopIteration`` for none), parameters on several devices, or on the meta device (no values).

    Raises:
        ValueError: any of those, naming ``model``.
    """
    parameters = list(model.parameters())
    if not any(p.requires_grad for p in parameters):
        raise ValueError(f"model must have at least one parameter that requires a gradient (the trainer steps them), "
                         f"got {len(parameters)} parameters, none trainable")
    devices = sorted({str(p.device) for p in parameters})
    if len(devices) != 1 or parameters[0].is_meta:
        raise ValueError(f"model must have its parameters on one device (with values: not meta), "
                         f"got parameters on {devices}")
    return parameters[0].device


class FixedCapacityTrainer:
    """Trains a packed language model on :class:`PackedBatch` es of one capacity ``(T, N)``.

    Three ways to run the same step (forward, backward, eager fused Adam):

    * ``use_graph=False``: eagerly, on all ``T`` rows (``eager_rows="capacity"``: the same shapes
      and kernels as the graph, every step) or on the batch's ``L`` real rows only
      (``eager_rows="active"``: no work for the padding, but new shapes every step);
    * ``use_graph=True``: one CUDA graph captured at capacity ``T``, replayed for every batch;
    * ``use_graph=True, capacities=[...]``: one graph per token capacity in a shared pool, each
      batch replaying the smallest that holds its ``L`` (the largest must be ``T``).

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
        first_batch: a batch at the capacity ``(T, N)`` every later batch must have (eager or
            not); it fixes the static buffers' shapes, and the graphs are warmed up and captured
            on it.
        use_graph: capture the step (CUDA only).
        capacities: token capacities of graph buckets (ints, the largest ``T``), or ``None`` for
            one graph at ``T``. Only with ``use_graph``.
        max_seqlen: the bound baked into the graphs where the model needs one; default ``T``, the
            only value safe for every batch of capacity ``T``.
        lr: Adam learning rate.
        eager_rows: without a graph, ``"capacity"`` or ``"active"`` (see above).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` with a ``loss`` method; ``first_batch`` is not
            a :class:`PackedBatch`; a flag not a bool.
        ValueError: ``model`` has no parameter that requires a gradient, or its parameters are
            on a meta device or on several devices; ``first_batch`` on the meta device;
            ``use_graph`` on a non-CUDA device;
            ``max_seqlen`` outside ``[1, T]``; ``capacities`` without ``use_graph``, or whose
            largest is not ``T``.

    Parameters with ``requires_grad=False`` (a frozen embedding, say) are left as they are: only
    the trainable ones get gradients and Adam steps.
    """

    def __init__(
        self,
        model: nn.Module,
        first_batch: PackedBatch,
        *,
        use_graph: bool,
        capacities: Sequence[int] | None = None,
        max_seqlen: int | None = None,
        lr: float = 1e-3,
        eager_rows: str = "capacity",
    ) -> None:
        if not isinstance(model, nn.Module) or not callable(getattr(model, "loss", None)):
            raise TypeError(f"model must be an nn.Module with a loss(...) method, got {type(model).__name__}")
        if not isinstance(first_batch, PackedBatch):
            raise TypeError(f"first_batch must be a PackedBatch, got {type(first_batch).__name__}")
        if first_batch.input_ids.is_meta:
            raise ValueError("first_batch must hold values (a batch on the meta device has none to train on)")
        device = check_model_parameters(model)
        check_bool("use_graph", use_graph)
        if use_graph and device.type != "cuda":
            raise ValueError(f"FixedCapacityTrainer: use_graph=True needs CUDA parameters, got {device}")
        capacity = first_batch.token_capacity
        self.max_seqlen = check_int("max_seqlen", capacity if max_seqlen is None else max_seqlen,
                                    minimum=1, maximum=capacity)
        self.needs_max_seqlen = bool(getattr(model, "needs_max_seqlen", False))
        check_real("lr", lr, minimum=0)
        self.eager_rows = check_choice("eager_rows", eager_rows, ("capacity", "active"))
        if capacities is not None:
            if not use_graph:
                raise ValueError("capacities are graph buckets: they need use_graph=True, got use_graph=False")
            capacities = sorted(set(check_int_sequence("capacities", capacities, minimum=1, maximum=capacity)))
            if capacities[-1] != capacity:
                raise ValueError(f"capacities must end at the batch capacity T = {capacity}, got {capacities}")
        self.model, self.use_graph, self.capacities = model, use_graph, capacities
        self.token_capacity, self.sequence_capacity = capacity, first_batch.sequence_capacity
        self.device = device
        # The trainable ones: a frozen parameter (fine-tuning) has no gradient to take or step.
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.parameter_names = tuple(name for name, _ in trainable)
        self.parameters = tuple(p for _, p in trainable)
        self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True)
        self.graph = self.buckets = self.static = None
        if use_graph and capacities is None:
            self.static = StaticInputs(first_batch, device)
            self.graph, (self._loss, self._grads) = capture_graph(
                lambda: self._forward_backward(self.static, self.max_seqlen))
        elif use_graph:
            self.buckets = GraphBuckets(
                self._bucket_step, capacities,
                token_inputs={name: getattr(first_batch, name) for name in _TOKEN_FIELDS},
                fixed_inputs={"cu_seqlens": first_batch.cu_seqlens},
                token_outputs=[False] * (1 + len(self.parameters)),
            )

    @property
    def graph_gradients(self) -> tuple[Tensor, ...]:
        """The one captured graph's gradient outputs, one per parameter, at fixed addresses: every
        replay rewrites them and :meth:`step` attaches them as ``.grad``.

        Raises:
            RuntimeError: the trainer has no single captured graph (eager, or graph buckets).
        """
        if self.graph is None:
            raise RuntimeError("graph_gradients exist only with use_graph=True and no capacities (one captured graph)")
        return self._grads

    def _forward_backward(self, inputs, max_seqlen: int, *,
                          allow_unused: bool = False) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The loss and one gradient per parameter.

        ``allow_unused`` (eager steps on a batch with no real tokens, ``L = 0``, only): a parameter
        the loss does not reach (an attention that skips every empty sequence never uses its
        projections) gets a zero gradient, the one a captured graph computes for such a batch
        (every row is masked out of the loss). Never while capturing: a zero materialised at
        capture would be replayed as that parameter's gradient for every later batch.
        """
        loss = self.model.loss(inputs["input_ids"], inputs["labels"], inputs["loss_mask"], inputs["cu_seqlens"],
                               max_seqlen)
        # A model of one's own: autograd's "grad can be implicitly created only for scalar outputs"
        # or "'NoneType' object is not iterable" named neither model.loss nor what it must return.
        if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.dtype.is_floating_point:
            got = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
            raise TypeError(f"model.loss must return a floating scalar tensor (one element), got {got}")
        # The seed gradient (a fill of ones) is launched here, outside the model's regions;
        # autograd's own kernels get "<region> backward" labels from the regions that made them.
        with mark_kernels("backward"):
            if allow_unused:
                return loss, torch.autograd.grad(loss, self.parameters, allow_unused=True, materialize_grads=True)
            grads = torch.autograd.grad(loss, self.parameters, allow_unused=True)
        # A trainable parameter the loss never reaches: autograd's "One of the differentiated
        # Tensors appears to not have been used in the graph" named none of them. (A host check on
        # the returned list: nothing is read from the device.)
        unused = [name for name, grad in zip(self.parameter_names, grads) if grad is None]
        if unused:
            raise ValueError(f"model.loss must reach every trainable parameter, got none for {unused[:6]}"
                             f"{f' and {len(unused) - 6} more' if len(unused) > 6 else ''}: freeze them "
                             "(requires_grad_(False)) before building the trainer, or remove them")
        return loss, grads

    def _bucket_step(self, inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
        capacity = inputs["input_ids"].shape[0]
        # Every bucket is warmed up and captured on the first batch, whose sequences may run past
        # a small bucket's capacity: clamped boundaries keep attention inside the prefix. A batch
        # that fits the bucket (every replayed one) is left unchanged by the clamp.
        inputs = {**inputs, "cu_seqlens": inputs["cu_seqlens"].clamp(max=capacity)}
        loss, grads = self._forward_backward(inputs, min(self.max_seqlen, capacity))
        return (loss, *grads)

    def step(self, batch: PackedBatch) -> Tensor:
        """Train on one batch; returns its loss as a device scalar in the dtype model.loss gives (float32 for
        the package's models below float64; a fresh copy).

        No host synchronisation: the copy from pinned memory, the replay and the optimizer step
        are all queued on the current stream. The batch's ``L`` and longest sequence are host ints
        (``batch.active_tokens``, ``batch.max_seqlen``): choosing a bucket and checking the graph's
        key cost nothing.

        A batch with no real tokens (``L = 0``) or no counted row has loss 0 and zero gradients in
        every mode, eager or replayed; the Adam step still runs on them (a no-op for fresh Adam
        state, a momentum-only update after earlier steps), so every mode advances alike.

        Raises:
            TypeError: ``batch`` is not a :class:`PackedBatch`; ``model.loss`` returned something
                other than a floating one-element tensor (eager steps; a graph's is checked when
                it is captured).
            ValueError: ``model.loss`` does not reach a trainable parameter on a batch with real
                tokens (eager steps; a graph's at capture), naming the parameters; a parameter
                trainable when the trainer was built has been frozen since (a replayed graph
                would still update it).
            ValueError: ``batch`` is on the meta device; the batch does not have the capacity ``(T, N)`` of ``first_batch`` (in
                every mode: eager steps refuse it like graph replays), or (where the model needs
                a ``max_seqlen``) its longest sequence exceeds the one the graphs were captured with.
        """
        if not isinstance(batch, PackedBatch):
            raise TypeError(f"batch must be a PackedBatch, got {type(batch).__name__}")
        if batch.input_ids.is_meta:  # "Cannot copy out of meta tensor" from inside the copy before
            raise ValueError("batch must hold values (a batch on the meta device has none to train on)")
        # A parameter frozen after the trainer was built: a replayed graph still computes its
        # gradient and Adam still updates it, silently (an eager step raised autograd's "does not
        # require grad"). One attribute read per parameter, on the host.
        if not all(p.requires_grad for p in self.parameters):
            frozen = [n for n, p in zip(self.parameter_names, self.parameters) if not p.requires_grad]
            raise ValueError(f"the model's trainable parameters must stay trainable after the trainer is built, got "
                             f"{frozen[:6]} frozen since: build a new trainer after freezing (its graphs and "
                             "optimizer cover the parameters that were trainable then)")
        if (batch.token_capacity, batch.sequence_capacity) != (self.token_capacity, self.sequence_capacity):
            raise ValueError(
                f"batch must have the trainer's capacity T = {self.token_capacity} token rows and "
                f"N = {self.sequence_capacity} sequence slots (those of first_batch), got T = {batch.token_capacity} "
                f"and N = {batch.sequence_capacity}; pad batches to one capacity, or build a trainer per capacity"
            )
        if self.use_graph and self.needs_max_seqlen and batch.max_seqlen > self.max_seqlen:
            raise ValueError(
                f"batch.max_seqlen must be <= the max_seqlen = {self.max_seqlen} the graph was captured with "
                f"(the attention's grid is sized by it), got {batch.max_seqlen}; capture with a larger max_seqlen "
                "(T is always safe) or use an attention that reads the layout on the device"
            )
        if self.graph is not None:
            self.static.copy_(batch)
            self.graph.replay()
            loss, grads = self._loss, self._grads
        elif self.buckets is not None:
            fields = {name: getattr(batch, name) for name in (*_TOKEN_FIELDS, "cu_seqlens")}
            loss, *grads = self.buckets.replay(fields, batch.active_tokens)
        else:
            rows = batch.active_tokens if self.eager_rows == "active" else batch.token_capacity
            inputs = {name: getattr(batch, name)[:rows].to(self.device, non_blocking=True) for name in _TOKEN_FIELDS}
            inputs["cu_seqlens"] = batch.cu_seqlens.to(self.device, non_blocking=True)
            # L = 0: every gradient is zero, as a replay computes it (see _forward_backward).
            loss, grads = self._forward_backward(inputs, max(batch.max_seqlen, 1),
                                                 allow_unused=batch.active_tokens == 0)
        # The graph's gradient outputs are attached, not copied: Adam reads them in place, and the
        # next replay rewrites the same storage.
        for parameter, grad in zip(self.parameters, grads):
            parameter.grad = grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()
