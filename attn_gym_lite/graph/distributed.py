"""Data parallelism for packed batches: one global token mean over ranks, and a DDP step that can
be captured as one CUDA graph per rank.

Every rank trains on its own packed batch, with ``c_r`` loss-masked tokens on rank ``r``. The run
should minimise the mean over *all* tokens, ``(S_0 + ... + S_{W-1}) / C`` with ``S_r`` rank ``r``'s
summed per-token loss and ``C = c_0 + ... + c_{W-1}``, not the mean of the ranks' own means
``S_r / c_r`` (what ``packed_lm_loss`` gives), which weights a token on a sparsely filled rank more.
DDP averages gradients over the ``W`` ranks, so each rank back-propagates ``l_r = W * S_r / C``:
``(1/W) sum_r grad(W * S_r / C) = grad(sum_r S_r / C)``. ``C`` is an ``all_reduce`` on the device,
with no host read, so the loss can sit inside a captured graph (NCCL >= 2.9.6 captures collectives).

Sources: PyTorch's DDP notes and API reference; PyTorch's CUDA semantics notes, "CUDA Graphs" ->
"Usage with DistributedDataParallel"; NCCL's "Using NCCL with CUDA Graphs"; Megatron-LM pull
request 6021 (DDP's gradient accumulators must be created on the capturing stream).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from ..data import PackedBatch
from ..models.lm import token_loss_sum  # re-exported: one source of truth in the models layer
from ..regions import mark_kernels
from .capture import StaticInputs, capture_graph

Tensor = torch.Tensor

__all__ = ["CAPTURE_ENVIRONMENT", "DDP_CAPTURE_WARMUP", "DataParallelTrainer", "global_token_mean_loss",
           "token_loss_sum"]

#: Eager DDP iterations PyTorch's CUDA-graph notes require before capturing a DDP backward. DDP
#: rebuilds its buckets in the second and records timing events in iterations 1-10 and every
#: 100th; the capture, iteration 12, holds none of that.
DDP_CAPTURE_WARMUP = 11

#: The environment every process of a captured data-parallel run starts with, before
#: ``init_process_group``: DDP's asynchronous NCCL error handling off (step 1 of PyTorch's recipe),
#: and NVLink multicast (NVLS) off, as the project's GPU host requires.
CAPTURE_ENVIRONMENT = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask")


def global_token_mean_loss(token_loss_sum: Tensor, active_tokens: Tensor,
                           group: dist.ProcessGroup | None = None) -> Tensor:
    """This rank's share of the mean loss over every rank's loss-masked tokens, scaled for DDP.

    Returns ``l_r = W * S_r / max(C, 1)``: ``S_r = token_loss_sum`` (0-dim, nats), ``C`` the sum of
    ``active_tokens`` (0-dim int, ``c_r``) over the ``W`` ranks of ``group``. Back-propagated through
    DDP's default averaging, every rank holds ``grad(sum_r S_r / C)``, however unevenly the tokens
    are spread. The rank average of ``l_r`` is the global mean loss. ``C`` is all-reduced on the
    device (no host read: capturable); every rank of ``group`` must call this, in the same order.
    """
    world_size = dist.get_world_size(group)
    global_tokens = active_tokens.to(torch.int64, copy=True)
    dist.all_reduce(global_tokens, op=dist.ReduceOp.SUM, group=group)
    return token_loss_sum / global_tokens.clamp_min(1).to(token_loss_sum.dtype) * world_size


class _TokenLossSum(nn.Module):
    """The module DDP wraps: its forward, which DDP runs to prepare the all-reduce, is the whole loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor,
                max_seqlen: int | None) -> tuple[Tensor, Tensor]:
        logits = self.model(input_ids, cu_seqlens, max_seqlen)
        with mark_kernels("loss"):
            return token_loss_sum(logits, labels, loss_mask)


class DataParallelTrainer:
    """Data-parallel training on packed batches of one capacity ``(T, N)``, one process per device.

    Each step: forward -> :func:`token_loss_sum` -> :func:`global_token_mean_loss` -> ``backward()``
    (DDP all-reduces and averages the gradients in buckets) -> fused Adam. Every rank ends the step
    with the gradient of the mean loss over all ranks' tokens in ``.grad``.

    With ``use_graph`` (CUDA, ``nccl``) the whole step, Adam included, is one CUDA graph per rank,
    following PyTorch's recipe for DDP under whole-network capture:

    1. ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` before ``init_process_group`` (:data:`CAPTURE_ENVIRONMENT`);
    2. DDP is built on the side stream that warms up and captures: autograd runs the gradient
       accumulators DDP keeps on the stream they were made on;
    3. :data:`DDP_CAPTURE_WARMUP` eager DDP iterations before the capture.

    ``gradient_as_bucket_view=True`` keeps every ``.grad`` at a fixed address in DDP's bucket, so the
    graph zeroes them in place and Adam (``capturable``) reads them there. The warm-up moved the
    parameters; they and Adam's state are put back, so the first :meth:`step` starts from the model
    as passed in. Every rank must build the trainer and call :meth:`step` equally often.

    Attributes:
        ddp: the ``DistributedDataParallel`` module: ``ddp(input_ids, labels, loss_mask, cu_seqlens,
            max_seqlen)`` returns this rank's ``(total, count)``.
        optimizer: the fused Adam; graph: the captured step or ``None``; world_size: ``W``.
    """

    def __init__(self, model: nn.Module, first_batch: PackedBatch, *, use_graph: bool = False, lr: float = 1e-3,
                 bucket_cap_mb: float | None = None) -> None:
        self.world_size = dist.get_world_size()
        self.device = device = next(model.parameters()).device
        self.max_seqlen = first_batch.token_capacity
        self.model, self.use_graph = model, use_graph
        self.parameters = tuple(model.parameters())
        options = {"gradient_as_bucket_view": True}
        if bucket_cap_mb is not None:
            options["bucket_cap_mb"] = bucket_cap_mb
        if device.type == "cuda":
            options["device_ids"] = [device]
        self.graph = self.static = self.stream = None
        if not use_graph:
            self.ddp = nn.parallel.DistributedDataParallel(_TokenLossSum(model), **options)
            self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True)
            return

        if os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", os.environ.get("NCCL_ASYNC_ERROR_HANDLING")) != "0":
            raise RuntimeError("use_graph=True needs TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in the environment before "
                               "init_process_group (PyTorch's CUDA-graph notes, DDP step 1)")
        # Step 2 of the recipe: DDP is built on the stream that warms up and captures.
        self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self.stream):
            self.ddp = nn.parallel.DistributedDataParallel(_TokenLossSum(model), **options)
        torch.cuda.current_stream(device).wait_stream(self.stream)
        # capturable: the step count is a device tensor, so the update reads nothing from the host.
        self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True, capturable=True)
        self.static = StaticInputs(first_batch, device)
        initial = [parameter.detach().clone() for parameter in self.parameters]
        # Step 3: the eager DDP iterations on the side stream, then the capture, on that stream.
        self.graph, self._loss = capture_graph(self._captured_step, warmup=DDP_CAPTURE_WARMUP, stream=self.stream)
        # Undo the warm-up's training in place (the graph reads these addresses); Adam restarts from zeros.
        with torch.no_grad():
            for parameter, value in zip(self.parameters, initial):
                parameter.copy_(value)
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, Tensor):
                        value.zero_()

    def _forward_backward(self, inputs, max_seqlen: int) -> Tensor:
        # Zero in place: under capture the gradients (DDP bucket views) keep their addresses.
        for parameter in self.parameters:
            if parameter.grad is not None:
                parameter.grad.zero_()
        total, count = self.ddp(*(inputs[name] for name in _TOKEN_FIELDS), inputs["cu_seqlens"], max_seqlen)
        loss = global_token_mean_loss(total, count)
        with mark_kernels("backward"):
            loss.backward()
        # The global mean loss, for reporting: the rank average of the scaled losses.
        reported = loss.detach() / self.world_size
        dist.all_reduce(reported, op=dist.ReduceOp.SUM)
        return reported

    def _captured_step(self) -> Tensor:
        reported = self._forward_backward(self.static, self.max_seqlen)
        with mark_kernels("optimizer"):
            self.optimizer.step()
        return reported

    def forward_backward(self, batch: PackedBatch) -> Tensor:
        """Eager forward and backward without the optimizer step: ``.grad`` then holds the gradient of
        the global token mean loss, which is returned (0-dim device tensor, no host sync)."""
        inputs = {name: getattr(batch, name).to(self.device, non_blocking=True) for name in (*_TOKEN_FIELDS, "cu_seqlens")}
        return self._forward_backward(inputs, max(batch.max_seqlen, 1)).clone()

    def step(self, batch: PackedBatch) -> Tensor:
        """Train on this rank's batch (forward, backward, all-reduce, Adam); returns the global mean
        loss, a fresh 0-dim device tensor. With a graph: copy the batch in and replay."""
        if self.graph is None:
            loss = self.forward_backward(batch)
            self.optimizer.step()
            return loss
        self.static.copy_(batch)
        self.graph.replay()
        return self._loss.clone()
