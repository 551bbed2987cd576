"""Packed language models: the one-block ``PackedLM`` of the training-loop chapter, and the
``PackedTransformer`` that chapter 8 ("Putting it together") trains with the whole stack.

A packed batch is ``input_ids [T]`` whose first ``L = cu_seqlens[-1]`` rows are real tokens and
whose remaining ``T - L`` rows are inactive capacity; the loss selects the rows ``loss_mask``
names, so inactive rows never reach it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import FLOATING_DTYPES, check_factory, check_int, check_real, check_tensor
from ..regions import mark_kernels
from .attention import VarLenAttention, check_heads

Tensor = torch.Tensor


_NO_IGNORED_LABEL = torch.iinfo(torch.int64).min  # cross_entropy's ignore_index, made unreachable


def token_loss_sum(logits: Tensor, labels: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of next-token cross-entropies over the rows ``loss_mask`` selects, and how many rows.

    The numerator and denominator of :func:`packed_lm_loss` (which returns their quotient, the
    *local* mean), kept apart so that the denominator can be summed over ranks
    (:func:`~attn_gym_lite.graph.distributed.global_token_mean_loss`). Rows outside ``loss_mask``
    are selected away, never multiplied by 0 (a garbage logit on an inactive row must not become
    ``NaN * 0``). No host synchronisation: on CUDA the checks read only tensor metadata, so it
    can run inside a CUDA graph capture. On the CPU (outside ``torch.compile``) the selected
    labels' values are read and checked too: there the read costs no synchronisation.

    Args:
        logits: floating ``[T, V]`` (``T`` token capacity, ``V >= 1`` vocabulary size).
        labels: int64 ``[T]`` targets in ``[0, V)`` on the rows ``loss_mask`` selects; the other
            rows' labels are never used (anything there is harmless). No ``ignore_index``: every
            selected row counts, so a row without a target is excluded by ``loss_mask``, not by
            ``-100``. On the CPU a selected label outside ``[0, V)`` raises ``ValueError``; on
            CUDA it is not checked (the check would read the device, a sync, and is impossible
            during a capture): cross-entropy's device-side assert fires instead. Check labels
            on the host before copying them (:class:`~attn_gym_lite.data.PackedBatch` refuses
            negative ones).
        loss_mask: bool ``[T]``, True on the rows the loss counts (at most ``L`` of them).

    Returns:
        ``(total, count)``: ``total`` a 0-dim tensor in nats, in ``float32`` for half-precision
        logits and in the logits' dtype otherwise (float64 stays float64); ``count`` a 0-dim
        int64 tensor (tokens). Both on the logits' device.

    Raises:
        TypeError: an argument is not a tensor or has the wrong dtype.
        ValueError: wrong numbers of dims, row counts that differ, ``V = 0``, or different devices;
            on the CPU (not while ``torch.compile`` traces), a selected label outside ``[0, V)``.
    """
    check_tensor("logits", logits, ndim=2, shape="[T, V]", dtypes=FLOATING_DTYPES)
    if logits.shape[1] == 0:
        raise ValueError(f"logits must have shape [T, V] with V >= 1 (the vocabulary), got shape {tuple(logits.shape)}")
    check_tensor("labels", labels, ndim=1, shape="[T]", dtypes=(torch.int64,), device=logits.device)
    check_tensor("loss_mask", loss_mask, ndim=1, shape="[T]", dtypes=(torch.bool,), device=logits.device)
    if not labels.shape[0] == loss_mask.shape[0] == logits.shape[0]:
        raise ValueError(
            f"logits, labels and loss_mask must have the same T rows, got {tuple(logits.shape)}, "
            f"{tuple(labels.shape)} and {tuple(loss_mask.shape)}"
        )
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        _check_selected_labels(labels, loss_mask, logits.shape[1])
    dtype = torch.promote_types(logits.dtype, torch.float32)
    # Unselected rows get target 0, so a stale or padding label there cannot fail the gather; no
    # label value is ignorable (ignore_index out of int64's reach), so a -100 on a selected row
    # fails loudly instead of counting as a zero loss in the mean.
    targets = torch.where(loss_mask, labels, 0)
    token_losses = F.cross_entropy(logits.to(dtype), targets, reduction="none", ignore_index=_NO_IGNORED_LABEL)
    total = torch.where(loss_mask, token_losses, 0.0).sum()
    return total, loss_mask.sum(dtype=torch.int64)


def _check_selected_labels(labels: Tensor, loss_mask: Tensor, vocab_size: int) -> None:
    """Every label ``loss_mask`` selects in ``[0, vocab_size)``; CPU tensors only (no sync)."""
    rows = torch.nonzero(loss_mask & ((labels < 0) | (labels >= vocab_size))).flatten()
    if rows.numel() > 0:
        row = int(rows[0])
        value = int(labels[row])
        hint = "; rows without a target are excluded by loss_mask, not by -100" if value < 0 else ""
        raise ValueError(
            f"labels must be in [0, V) = [0, {vocab_size}) (V = logits.shape[1]) on the rows loss_mask selects, "
            f"got labels[{row}] = {value} where loss_mask[{row}] is True ({rows.numel()} such rows){hint}"
        )


def _check_mask_within_active_rows(loss_mask: object, cu_seqlens: Tensor) -> None:
    """A CPU bool ``loss_mask`` False on rows ``L..T-1``, ``L = cu_seqlens[-1]`` (CPU values only,
    read for free; ``forward`` has checked ``cu_seqlens``). Anything else is left to
    :func:`token_loss_sum`'s metadata checks, or trusted on CUDA (capture-safe)."""
    if not (isinstance(loss_mask, Tensor) and loss_mask.device.type == "cpu" and loss_mask.dtype == torch.bool
            and loss_mask.ndim == 1 and cu_seqlens.device.type == "cpu") or torch.compiler.is_compiling():
        return
    active_tokens = int(cu_seqlens[-1])
    rows = torch.nonzero(loss_mask[active_tokens:]).flatten()
    if rows.numel() > 0:
        row = active_tokens + int(rows[0])
        raise ValueError(
            f"loss_mask must be False on the inactive rows L..T-1 = {active_tokens}..{loss_mask.shape[0] - 1} "
            f"(L = cu_seqlens[-1]; the loss would count rows past the batch), got loss_mask[{row}] = True "
            f"({rows.numel()} such rows)"
        )


def _check_input_ids(input_ids: Tensor, vocab_size: int) -> None:
    """``input_ids`` an int64 (or int32, which ``nn.Embedding`` takes too) ``[T]`` tensor and, where
    it is on the CPU (and ``torch.compile`` is not tracing), every id in ``[0, vocab_size)``. The one check every model's ``forward`` makes.

    Capture-safe: only a CPU tensor's values are read (free there); a CUDA tensor is checked by
    its metadata alone, since reading it would synchronise and is impossible during a capture.

    Raises:
        TypeError: not a tensor, or neither int64 nor int32.
        ValueError: not 1-D (a ``[1, T]`` batch dim, say); a CPU id outside ``[0, vocab_size)``.
    """
    # Metadata first: a [1, T] input would otherwise embed to [1, T, dim] and fail later as a
    # token capacity of 1 in the attention's cu_seqlens check, naming neither input_ids nor its shape.
    check_tensor("input_ids", input_ids, ndim=1, shape="[T] (1-D: a packed batch has no batch dim)", dtypes=(torch.int64, torch.int32))
    if input_ids.device.type != "cpu" or torch.compiler.is_compiling():
        return
    rows = torch.nonzero((input_ids < 0) | (input_ids >= vocab_size)).flatten()
    if rows.numel() > 0:
        row = int(rows[0])
        raise ValueError(
            f"input_ids must be token ids in [0, V) = [0, {vocab_size}) (V = the embedding's vocabulary), "
            f"got input_ids[{row}] = {int(input_ids[row])} ({rows.numel()} such rows)"
        )


def packed_lm_loss(logits: Tensor, labels: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean next-token cross-entropy over the rows ``loss_mask`` selects: ``total / max(count, 1)``
    of :func:`token_loss_sum`.

    No host sync on CUDA (capture-safe). Select, never multiply: a garbage logit on a masked row
    must not become ``NaN * 0``. An all-False mask gives 0 rather than NaN (the denominator is
    clamped to 1).

    Args:
        logits: floating ``[T, V]``, ``V >= 1``.
        labels: int64 ``[T]``, in ``[0, V)`` on the selected rows; anything on the other rows
            (stale data, padding, ``-100``) is never read. No ``ignore_index``: a ``-100`` on a
            selected row is an error, not a zero loss in the mean (checked on the CPU only, see
            :func:`token_loss_sum`).
        loss_mask: bool ``[T]``, True on the rows the loss counts.

    Returns:
        A 0-dim tensor in nats on the logits' device: ``float32`` for half-precision (and
        float32) logits, float64 for float64 logits.

    Raises:
        TypeError / ValueError: see :func:`token_loss_sum` (types, dtypes, shapes, devices; on
            the CPU a selected label outside ``[0, V)``; on CUDA that label is not checked and
            cross-entropy's device-side assert fires instead).
    """
    total, count = token_loss_sum(logits, labels, loss_mask)
    return total / count.clamp_min(1)


class _PackedLanguageModel(nn.Module):
    """What every packed language model here shares: the loss over ``loss_mask`` and whether its
    attention sizes its work by ``max_seqlen``, and ``forward``, which checks ``input_ids`` (``loss``
    relies on it: it does not check them again). Subclasses define ``embedding``, ``_attention``
    and ``_logits`` (the network from checked ids to logits)."""

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether the attention sizes its work by ``max_seqlen`` (then a graph bakes it in)."""
        return self._attention().needs_max_seqlen

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        """Logits of a packed batch.

        Args:
            input_ids: int64 ``[T]`` token ids in ``[0, vocab_size)``, the first ``L`` rows real.
            cu_seqlens: int32 ``[N + 1]`` prefix sums, ``cu_seqlens[-1] = L <= T``.
            max_seqlen: the longest sequence (tokens); used only where ``needs_max_seqlen``.

        Returns:
            logits ``[T, vocab_size]`` in the parameters' dtype, on their device.

        Raises:
            TypeError: ``input_ids`` not a tensor or neither int64 nor int32; ``cu_seqlens`` not an
                int32 tensor.
            ValueError: ``input_ids`` not 1-D (a ``[1, T]`` batch dim, say); a CPU ``input_ids``
                (not while ``torch.compile`` traces) with an id outside ``[0, vocab_size)``, the
                message naming the first such row (a CUDA one is not read: the embedding's
                device-side assert fires instead); ``cu_seqlens`` breaking the layout rules, or on
                the CPU the value rules (:func:`attn_gym_lite.ragged.active_token_mask`).
        """
        _check_input_ids(input_ids, self.embedding.num_embeddings)
        return self._logits(input_ids, cu_seqlens, max_seqlen)

    def loss(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor,
             max_seqlen: int | None = None) -> Tensor:
        """Mean cross-entropy over ``loss_mask`` (:func:`packed_lm_loss`) of ``forward``'s logits.

        ``input_ids`` is checked by ``forward`` (its shape and dtype; on the CPU its ids too), the
        labels by :func:`token_loss_sum` (on the CPU, those ``loss_mask`` selects). A CPU
        ``loss_mask`` must be False on the inactive rows ``L..T-1`` (``L = cu_seqlens[-1]``), as
        :class:`~attn_gym_lite.data.PackedBatch` requires: else the mean would count rows past
        the batch. A CUDA ``loss_mask`` is trusted (reading it would synchronise and is impossible
        during a capture): build it with :class:`~attn_gym_lite.data.PackedBatch`, which checks it.

        Raises:
            TypeError / ValueError: what ``forward`` raises (``input_ids`` not int64 ``[T]``, a CPU
                id outside ``[0, V)``, a bad ``cu_seqlens``); a label outside ``[0, V)`` on a CPU
                row ``loss_mask`` selects, or a bad ``labels`` or ``loss_mask`` (:func:`token_loss_sum`).
            ValueError: a CPU ``loss_mask`` True on a row at or past ``L`` (not while
                ``torch.compile`` traces).
        """
        logits = self(input_ids, cu_seqlens, max_seqlen)
        _check_mask_within_active_rows(loss_mask, cu_seqlens)
        with mark_kernels("loss"):
            return packed_lm_loss(logits, labels, loss_mask)


class PackedLM(_PackedLanguageModel):
    """A one-block causal language model over packed batches, for the training-loop chapter.

    embedding -> RMSNorm -> causal ``VarLenAttention`` (residual) -> RMSNorm -> LM head.
    Inactive capacity is masked inside the attention, so ``loss`` is exactly the mean next-token
    cross-entropy over the positions where ``loss_mask`` is True.

    Args:
        vocab_size: tokenizer vocabulary size.
        dim, num_heads: attention width and heads.
        impl, schedule: the attention implementation and Triton schedule (``VarLenAttention``).
            ``"triton"`` needs a head dim ``dim // num_heads`` in 16, 32, 64, 128 (refused here,
            with ``dim`` and ``num_heads`` named); ``"auto"`` with another head dim falls back to
            the reference attention, which cannot be captured in a CUDA graph.
        device, dtype: of the parameters.

    Raises:
        TypeError / ValueError: ``vocab_size`` not an int ``>= 1`` (as :class:`PackedTransformer`).
        TypeError: ``dim`` or ``num_heads`` not an int (checked before ``dim`` sizes a layer).
        ValueError: ``dim`` not a positive multiple of ``num_heads``, or ``impl="triton"`` with a
            head dim not in 16, 32, 64, 128; ``impl`` or ``schedule`` unknown.
        TypeError / ValueError: ``device`` or ``dtype`` refused by
            :func:`~attn_gym_lite.checks.check_factory` (a string torch does not parse, ``"cuda"``
            without a GPU, a non-floating ``dtype``).
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, *, impl: str = "auto", schedule: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        # dim and num_heads before the embedding uses dim (a float dim failed inside nn.Embedding).
        check_heads("VarLenAttention", dim, num_heads, impl)
        factory = check_factory(device, dtype)
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.norm_in = nn.RMSNorm(dim, **factory)
        self.attention = VarLenAttention(dim, num_heads, causal=True, mask_inactive_capacity=True, impl=impl,
                                         schedule=schedule, **factory)
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.attention

    def _logits(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None) -> Tensor:
        # Named regions: record_function ranges in eager traces, and labels on the kernels of a
        # captured graph (see attn_gym_lite.profiling).
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
        with mark_kernels("attention"):
            h = h + self.attention(self.norm_in(h), cu_seqlens, max_seqlen)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h + attention(RMSNorm(h))``, then ``h + MLP(RMSNorm(h))``.

    The attention is a causal :class:`VarLenAttention` with RoPE (positions restart at every
    sequence) and its inactive-capacity masks; the MLP is SwiGLU (``down(silu(gate) * up)``),
    token-parallel, so it needs no mask: an inactive row only ever changes itself, and every row
    it sees is finite (the attention's output is masked).

    Args:
        dim: model width, a positive multiple of ``num_heads``.
        num_heads: attention heads (head dim ``dim // num_heads``).
        hidden: the SwiGLU hidden width, >= 1.
        impl, schedule: as for :class:`VarLenAttention`.
        device, dtype: where and in what the parameters are made (a floating dtype).

    Raises:
        ValueError: ``dim`` or ``num_heads`` is not a positive int or ``dim`` is not a multiple of
            ``num_heads`` (a wrong type too), or ``impl="triton"`` with a head dim not in 16, 32,
            64, 128, or an odd head dim (the block's attention is rotary) (the message names
            ``VarLenAttention``, ``dim`` and ``num_heads``); ``hidden``
            < 1; ``impl`` or ``schedule`` not one of their choices.
        TypeError: ``hidden`` is not an int.
        TypeError / ValueError: ``device`` or ``dtype`` refused by
            :func:`~attn_gym_lite.checks.check_factory` (a string torch does not parse, ``"cuda"``
            without a GPU, a non-floating ``dtype``).
    """

    def __init__(self, dim: int, num_heads: int, hidden: int, *, impl: str, schedule: str,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = check_factory(device, dtype)
        # The attention first: it checks dim, num_heads and the head dim (naming VarLenAttention, as
        # every model's message does); registered after the norm, so the parameter order stays.
        attention = VarLenAttention(dim, num_heads, causal=True, mask_inactive_capacity=True, impl=impl,
                                    schedule=schedule, rotary=True, **factory)
        check_int("hidden", hidden, minimum=1)
        self.norm_attention = nn.RMSNorm(dim, **factory)
        self.attention = attention
        self.norm_mlp = nn.RMSNorm(dim, **factory)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False, **factory)
        self.down = nn.Linear(hidden, dim, bias=False, **factory)

    def forward(self, h: Tensor, cu_seqlens: Tensor, max_seqlen: int | None, rotary: tuple[Tensor, Tensor]) -> Tensor:
        with mark_kernels("attention"):
            h = h + self.attention(self.norm_attention(h), cu_seqlens, max_seqlen, rotary)
        with mark_kernels("mlp"):
            gate, up = self.gate_up(self.norm_mlp(h)).chunk(2, dim=-1)
            return h + self.down(F.silu(gate) * up)


class PackedTransformer(_PackedLanguageModel):
    """A small decoder-only transformer over packed batches: embedding, ``num_layers``
    :class:`TransformerBlock` s, RMSNorm, LM head (the recipe of chapter 8).

    Args:
        vocab_size: tokenizer vocabulary size.
        dim, num_heads, num_layers: width, heads (head dim ``dim // num_heads``) and depth.
        mlp_ratio: the SwiGLU hidden width is ``mlp_ratio * dim`` rounded up to a multiple of 64.
        impl, schedule: the attention implementation and Triton schedule (``VarLenAttention``).
            ``"triton"`` needs a head dim ``dim // num_heads`` in 16, 32, 64, 128 (refused here);
            ``"auto"`` with another head dim falls back to the reference attention, which
            cannot be captured in a CUDA graph.
        device, dtype: of the parameters.

    Shapes: ``forward(input_ids int64 [T], cu_seqlens int32 [N + 1], max_seqlen=None) ->
    logits [T, vocab_size]``; ``loss(input_ids, labels, loss_mask, cu_seqlens, max_seqlen=None)``
    is the mean cross-entropy over ``loss_mask``, exactly that of the ``L`` real rows alone.

    Raises:
        TypeError / ValueError: a size is not a positive int, ``dim`` not a multiple of
            ``num_heads``, or ``impl="triton"`` with a head dim not in 16, 32, 64, 128, or an odd
            head dim (its attention is rotary) (the message names ``dim``, ``num_heads`` and the
            head dim); ``mlp_ratio`` not a finite real number
            ``> 0``, or so small that the hidden width ``int(mlp_ratio * dim)`` is 0; ``device``
            or ``dtype`` refused by :func:`~attn_gym_lite.checks.check_factory` (a string torch
            does not parse, ``"cuda"`` without a GPU, a non-floating ``dtype``).

    Source: the Llama architecture (RMSNorm, RoPE, SwiGLU), packed as in the seed article.
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, num_layers: int, *, mlp_ratio: float = 8 / 3,
                 impl: str = "auto", schedule: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("num_layers", num_layers, minimum=1)
        # dim first (VarLenAttention's own check, so its message is the one every model gives):
        # the hidden width is computed from it.
        check_heads("VarLenAttention", dim, num_heads, impl, rotary=True)
        mlp_ratio = check_real("mlp_ratio", mlp_ratio, minimum=0)
        if int(mlp_ratio * dim) < 1:
            raise ValueError(
                f"mlp_ratio must give a hidden width int(mlp_ratio * dim) >= 1, got mlp_ratio={mlp_ratio!r} "
                f"with dim={dim}: {int(mlp_ratio * dim)}"
            )
        hidden = -(-int(mlp_ratio * dim) // 64) * 64
        factory = check_factory(device, dtype)
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, hidden, impl=impl, schedule=schedule, **factory) for _ in range(num_layers)
        )
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.blocks[0].attention

    def _logits(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None) -> Tensor:
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
            # One set of RoPE tables per step, shared by every layer.
            rotary = self.blocks[0].attention.rotary_tables(cu_seqlens, h.shape[0], h.dtype)
        for block in self.blocks:
            h = block(h, cu_seqlens, max_seqlen, rotary)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))
