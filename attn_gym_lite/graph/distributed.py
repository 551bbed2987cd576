"""Data parallelism for packed batches: one global token mean over ranks, a sharded loader, a DDP step.

With data parallelism every rank trains on its own packed batch, and the batches hold different
numbers of loss-masked tokens: ``c_r`` on rank ``r`` (at most ``T``, usually fewer). What the run
should minimise is the mean next-token cross-entropy over *all* those tokens,

    loss = (S_0 + ... + S_{W-1}) / C,     S_r = sum of rank r's per-token losses,  C = c_0 + ... + c_{W-1},

and not the mean of the ranks' own means (what :func:`~attn_gym_lite.models.packed_lm_loss`, and
so ``PackedLM.loss`` / ``PackedTransformer.loss``, give on each rank: ``S_r / c_r``), which weights
a token on a sparsely filled rank more than one on a full rank.

:class:`~torch.nn.parallel.DistributedDataParallel` all-reduces the gradients and divides them by
the world size ``W`` (its default communication: the bucket is divided by the process group's
size and summed over ranks; the API reference's note on summed losses says the same), so the
gradient every rank applies is ``(1/W) sum_r grad(l_r)`` for the loss ``l_r`` it back-propagated.
:func:`global_token_mean_loss` therefore returns

    l_r = W * S_r / C

whose rank average is ``(1/W) sum_r W * S_r / C = sum_r S_r / C``: DDP's averaged gradient is
exactly the gradient of the global token mean (``C`` depends on no parameter). ``C`` comes from a
tensor ``all_reduce`` of ``c_r`` on the device, with no host read, so the whole loss can sit inside
a captured CUDA graph (NCCL >= 2.9.6 captures collectives).

Also here:

* :func:`token_loss_sum`, ``S_r`` and ``c_r`` of one rank (defined in
  :mod:`attn_gym_lite.models.lm`, beside :func:`~attn_gym_lite.models.packed_lm_loss`, which
  returns their quotient, and re-exported here);
* each rank reads its own shard of the corpus through :mod:`attn_gym_lite.data.sharding`
  (:class:`~attn_gym_lite.data.sharding.ShardedPackedLoader`, resumable per rank);
* :class:`DataParallelTrainer`: forward, backward with DDP's all-reduce and a fused Adam step, run
  eagerly (tested on CPU with ``gloo``) or captured, optimizer step included, as one CUDA graph
  per rank following PyTorch's recipe for DDP under whole-network capture (tested by the
  ``gpu``-marked tests and measured by the ``scale-out`` suite on a host with two GPUs).

The package's :class:`~attn_gym_lite.graph.FixedCapacityTrainer` cannot simply be wrapped in DDP:
it takes gradients with ``torch.autograd.grad``, and DDP all-reduces only gradients accumulated into
``.grad`` by ``backward()`` (the DDP API notes say it does not work with ``torch.autograd.grad``).

On the GPU host, start every process with ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``
and ``NVSHMEM_DISABLE_NVLS=1`` in its environment (NVLink multicast stays off there), and, for the
captured step, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (:data:`CAPTURE_ENVIRONMENT`).

Sources: PyTorch's DDP notes and ``DistributedDataParallel`` API reference (gradient averaging,
``gradient_as_bucket_view``, ``static_graph``); PyTorch's CUDA semantics notes, "CUDA Graphs" →
"Usage with DistributedDataParallel" → "NCCL >= 2.9.6" (the three setup steps for whole-network
capture); NCCL's user guide, "Using NCCL with CUDA Graphs"; Megatron-LM pull request 6021 (DDP's
gradient accumulators must be created on the stream that captures, or full-iteration capture fails).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from ..checks import FLOATING_DTYPES, check_bool, check_int, check_real, check_tensor
from ..data import PackedBatch
from ..models.lm import token_loss_sum  # re-exported: one source of truth in the models layer
from ..regions import mark_kernels
from .capture import StaticInputs, capture_graph
from .training import check_model_parameters

Tensor = torch.Tensor

__all__ = [
    "CAPTURE_ENVIRONMENT",
    "DDP_CAPTURE_WARMUP",
    "DataParallelTrainer",
    "global_token_mean_loss",
    "token_loss_sum",
]

#: Eager DDP iterations PyTorch's CUDA-graph notes require before capturing a DDP backward
#: ("Your warmup must run at least 11 DDP-enabled eager iterations before capture").
DDP_CAPTURE_WARMUP = 11

# DDP's reducer records timing events in iterations 1-10 and every this many (its default
# runtime-logging sample rate, Reducer::should_collect_runtime_stats).
_DDP_STATS_SAMPLE_RATE = 100

#: The environment every process of a captured data-parallel run starts with. The first is step 1
#: of PyTorch's recipe (DDP's asynchronous NCCL error handling off; older torch read it as
#: ``NCCL_ASYNC_ERROR_HANDLING``); the other three keep NVLink multicast (NVLS) off, as the
#: project's GPU host requires. It must be in the environment before ``init_process_group``.
CAPTURE_ENVIRONMENT = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask")
_INTEGER_DTYPES = (torch.int32, torch.int64)


def global_token_mean_loss(token_loss_sum: Tensor, active_tokens: Tensor,
                           group: dist.ProcessGroup | None = None) -> Tensor:
    """This rank's share of the mean loss over every rank's loss-masked tokens, scaled for DDP.

    Returns ``l_r = W * S_r / max(C, 1)`` with ``S_r = token_loss_sum`` (this rank's summed
    per-token loss), ``C`` the sum of ``active_tokens`` over the ``W`` ranks of ``group`` and ``W``
    its size. Back-propagate ``l_r`` through a :class:`~torch.nn.parallel.DistributedDataParallel`
    model with its default gradient averaging (all-reduce, divide by ``W``): every rank then holds

        (1/W) sum_r grad(W * S_r / C) = grad(sum_r S_r / C),

    the gradient of the mean over all ``C`` tokens, however unevenly they are spread over the
    ranks. (With a communication hook that sums instead of averaging, use ``S_r / C``: divide the
    result by ``W``.) The rank average of ``l_r`` is the global mean loss; the value on one rank
    alone is not (all-reduce ``l_r / W`` to report it). With ``C = 0`` the loss is 0, not NaN,
    like :func:`~attn_gym_lite.models.packed_lm_loss`.

    ``C`` is computed by ``torch.distributed.all_reduce`` (SUM) of a copy of ``active_tokens`` on
    its device: no host read, so the call can be captured in a CUDA graph with NCCL; every rank of
    ``group`` must call it, the same number of times and in the same order. ``W`` is a host int
    read from the group. Multiplying by ``W`` is exact when ``W`` is a power of two.

    Args:
        token_loss_sum: 0-dim floating tensor, ``S_r`` in nats (e.g. :func:`token_loss_sum`'s
            ``total``), differentiable.
        active_tokens: 0-dim int32/int64 tensor on the same device, ``c_r >= 0``: the tokens this
            rank's loss counts (the loss-masked rows, not ``L``). Its value is not checked (that
            would read the device, and the call must stay capturable): a negative count is summed
            like any other, and a sum ``C <= 0`` is taken as 1.
        group: the process group DDP averages over; ``None`` for the default group.

    Returns:
        A 0-dim tensor in ``token_loss_sum``'s dtype and device.

    Raises:
        TypeError: an argument is not a tensor of the right kind, or ``group`` is not a
            ``ProcessGroup``.
        ValueError: a tensor is not 0-dim, or the two are on different devices.
        RuntimeError: ``torch.distributed`` is not initialized.
    """
    check_tensor("token_loss_sum", token_loss_sum, ndim=0, shape="[] (a scalar)", dtypes=FLOATING_DTYPES)
    check_tensor("active_tokens", active_tokens, ndim=0, shape="[] (a scalar)", dtypes=_INTEGER_DTYPES,
                  device=token_loss_sum.device)
    world_size = _world_size(group)
    global_tokens = active_tokens.to(torch.int64, copy=True)
    dist.all_reduce(global_tokens, op=dist.ReduceOp.SUM, group=group)
    return token_loss_sum / global_tokens.clamp_min(1).to(token_loss_sum.dtype) * world_size


def _world_size(group: object) -> int:
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group first")
    return dist.get_world_size(group)


class _TokenLossSum(nn.Module):
    """``model`` -> logits -> (:func:`token_loss_sum`): the module DDP wraps, so that its forward
    (which DDP needs to run to prepare the all-reduce) is the whole loss computation."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor,
                max_seqlen: int | None) -> tuple[Tensor, Tensor]:
        logits = self.model(input_ids, cu_seqlens, max_seqlen)
        with mark_kernels("loss"):
            return token_loss_sum(logits, labels, loss_mask)


class DataParallelTrainer:
    """Data-parallel training on :class:`~attn_gym_lite.data.PackedBatch` es of one capacity ``(T, N)``.

    One process per device. Each step: this rank's batch -> forward -> :func:`token_loss_sum` ->
    :func:`global_token_mean_loss` (all-reduce of the token count) -> ``backward()``, during which
    :class:`~torch.nn.parallel.DistributedDataParallel` all-reduces and averages the gradients in
    buckets -> fused Adam. Every rank ends the step with the gradient of the mean loss over all
    ranks' tokens in ``.grad``, and identical parameters.

    * ``use_graph=False``: eager, on all ``T`` rows (CPU with ``gloo``, or CUDA with ``nccl``).
    * ``use_graph=True`` (CUDA, ``nccl``, NCCL >= 2.9.6): the whole step, forward, backward, the
      all-reduces and the Adam step, captured as one CUDA graph per rank; each step only copies the
      batch into the static buffers and replays. PyTorch's CUDA-graph notes, "Usage with
      DistributedDataParallel" -> "NCCL >= 2.9.6", in three steps:

      1. DDP's asynchronous error handling is off before ``init_process_group``
         (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, in :data:`CAPTURE_ENVIRONMENT`): the caller's job,
         since the process group exists before this class; the constructor refuses to capture
         without it.
      2. DDP is constructed on the side stream that then warms up and captures. DDP keeps the
         parameters' gradient accumulators from construction on, and autograd runs them on the
         stream they were made on: made on another stream, the capture would depend on it.
      3. At least :data:`DDP_CAPTURE_WARMUP` (11) eager DDP iterations before capture (``warmup``).
         DDP does one-time work in its first iterations that a capture must not contain: it
         rebuilds its gradient buckets in the second (new gradient addresses) and records timing
         events for its runtime statistics in iterations 1-10 and every 100th (so the capture,
         iteration ``warmup + 1``, must not be a multiple of 100).

      ``gradient_as_bucket_view=True`` makes every ``.grad`` a view into DDP's bucket, at an address
      fixed once the buckets are rebuilt: the graph zeroes those gradients in place at the start of
      each replay and Adam reads them where the all-reduce left them. Adam is ``capturable`` (its
      step count lives on the device). The warm-up iterations run on ``first_batch`` and move the
      parameters; afterwards the parameters and Adam's state are put back to what they were, so
      the first :meth:`step` starts from the model as it was passed in, as the eager path does.

    Every rank must construct the trainer and call :meth:`step` the same number of times (both
    run collectives); the batches may have different ``L`` and numbers of loss-masked tokens, and
    that is what the loss accounts for.

    Args:
        model: a packed language model (``forward(input_ids, cu_seqlens, max_seqlen) -> logits
            [T, V]``, e.g. :class:`~attn_gym_lite.models.PackedTransformer`), with its parameters
            on this rank's device (CPU for ``gloo``; ``cuda:<local rank>``, the current device, for
            ``nccl``). DDP broadcasts rank 0's parameters and buffers to the other ranks at
            construction.
        first_batch: a batch at the capacity every later batch of this rank will have; the graph
            is warmed up and captured on it.
        use_graph: capture the step (CUDA and ``nccl`` only).
        lr: Adam learning rate.
        process_group: the group to train over; ``None`` for the default group.
        bucket_cap_mb: DDP's gradient bucket size (MiB); ``None`` for DDP's default (25 MiB).
            Fewer, larger buckets mean fewer all-reduce launches; smaller ones let communication
            start earlier in the backward and overlap more of it.
        static_graph: passed to DDP. The step trains the same parameters every iteration, so it is
            valid; the CUDA-graph notes do not require it.
        max_seqlen: as for :class:`~attn_gym_lite.graph.FixedCapacityTrainer`: the bound baked into
            the graph where the model's attention needs one; default ``T``.
        warmup: eager iterations before capture (>= 11), only with ``use_graph``.

    Attributes:
        ddp: the ``DistributedDataParallel`` module; ``ddp(input_ids, labels, loss_mask, cu_seqlens,
            max_seqlen)`` returns this rank's ``(total, count)`` (:func:`token_loss_sum`).
        optimizer: the fused Adam over ``model``'s parameters (``capturable`` with a graph).
        graph: the captured step, or ``None`` (eager).
        world_size: ``W``, the size of the process group.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``; ``first_batch`` not a ``PackedBatch``; a
            flag not a bool; ``process_group`` not a ``ProcessGroup``; ``warmup`` not an int.
        ValueError: ``model`` has no parameter that requires a gradient, or parameters on a meta
            device or on several devices; ``use_graph`` on a non-CUDA device or with another backend than ``nccl``;
            ``warmup < 11`` (or ``warmup + 1`` a multiple of 100) with ``use_graph``; ``max_seqlen`` outside ``[1, T]``; ``lr`` or
            ``bucket_cap_mb`` negative.
        RuntimeError: ``torch.distributed`` is not initialized; ``use_graph`` while
            ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is not ``"0"``; or the capture itself failed.
    """

    def __init__(self, model: nn.Module, first_batch: PackedBatch, *, use_graph: bool = False, lr: float = 1e-3,
                 process_group: dist.ProcessGroup | None = None, bucket_cap_mb: float | None = None,
                 static_graph: bool = False, max_seqlen: int | None = None,
                 warmup: int = DDP_CAPTURE_WARMUP) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(first_batch, PackedBatch):
            raise TypeError(f"first_batch must be a PackedBatch, got {type(first_batch).__name__}")
        check_model_parameters(model)  # DDP: a bare StopIteration, a RuntimeError for frozen or meta ones
        check_bool("use_graph", use_graph)
        check_bool("static_graph", static_graph)
        check_real("lr", lr, minimum=0)
        if bucket_cap_mb is not None:
            check_real("bucket_cap_mb", bucket_cap_mb, minimum=0)
        self.world_size = _world_size(process_group)
        device = next(model.parameters()).device
        # Its type always; its lower bound only matters with a graph (eager DDP needs no warm-up).
        check_int("warmup", warmup, minimum=DDP_CAPTURE_WARMUP if use_graph else 0)
        if use_graph:
            _check_capture_setup(device, process_group)
            if (warmup + 1) % _DDP_STATS_SAMPLE_RATE == 0:
                raise ValueError(f"warmup must not make the capture DDP's iteration {warmup + 1}: DDP records timing "
                                 f"events every {_DDP_STATS_SAMPLE_RATE}th iteration, got warmup={warmup}")
        capacity = first_batch.token_capacity
        self.max_seqlen = check_int("max_seqlen", capacity if max_seqlen is None else max_seqlen,
                                    minimum=1, maximum=capacity)
        self.needs_max_seqlen = bool(getattr(model, "needs_max_seqlen", False))
        self.model, self.device, self.use_graph, self.group = model, device, use_graph, process_group

        options = {"process_group": process_group, "gradient_as_bucket_view": True, "static_graph": static_graph}
        if bucket_cap_mb is not None:
            options["bucket_cap_mb"] = bucket_cap_mb
        if device.type == "cuda":
            options["device_ids"] = [device]
        self.parameters = tuple(model.parameters())
        self.graph = self.static = self.stream = None  # the graph path sets them
        if not use_graph:
            self.ddp = nn.parallel.DistributedDataParallel(_TokenLossSum(model), **options)
            self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True)
            return

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
        # Step 3: `warmup` eager DDP iterations on the side stream, then the capture, on that stream.
        self.graph, self._loss = capture_graph(self._captured_step, warmup=warmup, stream=self.stream)
        # The warm-up trained `warmup` steps on first_batch: undo them, in place (the graph reads
        # these tensors at these addresses). Adam's state (step, moments) starts from zeros.
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
        loss = global_token_mean_loss(total, count, self.group)
        with mark_kernels("backward"):
            loss.backward()
        # The global mean loss, for reporting: the rank average of the scaled losses.
        reported = loss.detach() / self.world_size
        dist.all_reduce(reported, op=dist.ReduceOp.SUM, group=self.group)
        return reported

    def _captured_step(self) -> Tensor:
        reported = self._forward_backward(self.static, self.max_seqlen)
        with mark_kernels("optimizer"):
            self.optimizer.step()
        return reported

    def forward_backward(self, batch: PackedBatch) -> Tensor:
        """Forward and backward on this rank's batch, without the optimizer step (eager only).

        Afterwards every parameter's ``.grad`` holds the gradient of the global token mean loss
        (identical on every rank). Returns that loss (nats per token, over all ranks' loss-masked
        tokens) as a 0-dim device tensor (a fresh copy); no host synchronisation.

        Raises:
            TypeError: ``batch`` is not a ``PackedBatch``.
            RuntimeError: the trainer captured a graph, whose replay always includes the optimizer
                step (use :meth:`step`; ``.grad`` afterwards holds the gradient it applied).
        """
        if not isinstance(batch, PackedBatch):
            raise TypeError(f"batch must be a PackedBatch, got {type(batch).__name__}")
        if self.graph is not None:
            raise RuntimeError("forward_backward runs eagerly only: the captured graph includes the optimizer step; "
                               "call step(), after which .grad holds the gradient that step applied")
        inputs = {name: getattr(batch, name).to(self.device, non_blocking=True) for name in (*_TOKEN_FIELDS, "cu_seqlens")}
        return self._forward_backward(inputs, max(batch.max_seqlen, 1)).clone()

    def step(self, batch: PackedBatch) -> Tensor:
        """Train on this rank's batch: forward, backward, all-reduce, Adam; returns the global mean loss.

        The loss is in nats per token over all ranks' loss-masked tokens, a 0-dim device tensor
        (a fresh copy); no host synchronisation. Afterwards every parameter's ``.grad`` holds the
        gradient the step applied (identical on every rank). With a graph: the batch is copied
        into the static buffers (asynchronously from pinned memory) and the step replayed.

        Raises:
            TypeError: ``batch`` is not a ``PackedBatch``.
            ValueError: with a graph, the batch has another capacity than ``first_batch``, or its
                longest sequence exceeds the captured ``max_seqlen`` where the model needs one.
        """
        if not isinstance(batch, PackedBatch):
            raise TypeError(f"batch must be a PackedBatch, got {type(batch).__name__}")
        if self.graph is None:
            loss = self.forward_backward(batch)
            self.optimizer.step()
            return loss
        if self.needs_max_seqlen and batch.max_seqlen > self.max_seqlen:
            raise ValueError(
                f"batch.max_seqlen must be <= the max_seqlen = {self.max_seqlen} the graph was captured with, "
                f"got {batch.max_seqlen}"
            )
        self.static.copy_(batch)
        self.graph.replay()
        return self._loss.clone()


def _check_capture_setup(device: torch.device, group: dist.ProcessGroup | None) -> None:
    """Refuse a capture that PyTorch's recipe says cannot work, before anything is built."""
    if device.type != "cuda":
        raise ValueError(f"use_graph=True needs CUDA parameters, got parameters on {device}")
    backend = str(dist.get_backend(group))
    if backend != "nccl":
        raise ValueError(f"use_graph=True needs the nccl backend (NCCL captures collectives), got backend {backend!r}")
    setting = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", os.environ.get("NCCL_ASYNC_ERROR_HANDLING"))
    if setting != "0":
        raise RuntimeError(
            "use_graph=True needs DDP's asynchronous error handling off: set TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in the "
            f"environment before init_process_group (PyTorch's CUDA-graph notes, DDP step 1), got {setting!r}"
        )
