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

from ..checks import check_int
from ..regions import mark_kernels
from .attention import VarLenAttention

Tensor = torch.Tensor


def packed_lm_loss(logits: Tensor, labels: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean next-token cross-entropy over the rows ``loss_mask`` (bool ``[T]``) selects.

    A float32 scalar on the device, no host sync. Select, never multiply: a garbage logit on a
    masked row must not become ``NaN * 0``. An all-False mask gives 0 rather than NaN (the
    denominator is clamped to 1).
    """
    token_losses = F.cross_entropy(logits.float(), labels, reduction="none")
    total = torch.where(loss_mask, token_losses, 0.0).sum()
    return total / loss_mask.sum().clamp_min(1)


class _PackedLanguageModel(nn.Module):
    """What every packed language model here shares: the loss over ``loss_mask`` and whether its
    attention sizes its work by ``max_seqlen``. Subclasses define ``forward`` and ``_attention``."""

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether the attention sizes its work by ``max_seqlen`` (then a graph bakes it in)."""
        return self._attention().needs_max_seqlen

    def loss(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor,
             max_seqlen: int | None = None) -> Tensor:
        """Mean cross-entropy over ``loss_mask`` (:func:`packed_lm_loss`)."""
        logits = self(input_ids, cu_seqlens, max_seqlen)
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
        device, dtype: of the parameters.
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, *, impl: str = "auto", schedule: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.norm_in = nn.RMSNorm(dim, **factory)
        self.attention = VarLenAttention(dim, num_heads, causal=True, mask_inactive_capacity=True, impl=impl,
                                         schedule=schedule, **factory)
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.attention

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        """``input_ids`` int64 ``[T]`` -> logits ``[T, vocab_size]``."""
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
    """

    def __init__(self, dim: int, num_heads: int, hidden: int, *, impl: str, schedule: str,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.norm_attention = nn.RMSNorm(dim, **factory)
        self.attention = VarLenAttention(dim, num_heads, causal=True, mask_inactive_capacity=True, impl=impl,
                                         schedule=schedule, rotary=True, **factory)
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
        device, dtype: of the parameters.

    Shapes: ``forward(input_ids int64 [T], cu_seqlens int32 [N + 1], max_seqlen=None) ->
    logits [T, vocab_size]``; ``loss(input_ids, labels, loss_mask, cu_seqlens, max_seqlen=None)``
    is the mean cross-entropy over ``loss_mask``, exactly that of the ``L`` real rows alone.

    Raises:
        TypeError / ValueError: a size is not a positive int, or ``dim`` not a multiple of
            ``num_heads``.

    Source: the Llama architecture (RMSNorm, RoPE, SwiGLU), packed as in the seed article.
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, num_layers: int, *, mlp_ratio: float = 8 / 3,
                 impl: str = "auto", schedule: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("num_layers", num_layers, minimum=1)
        hidden = -(-int(mlp_ratio * dim) // 64) * 64
        factory = {"device": device, "dtype": dtype}
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, hidden, impl=impl, schedule=schedule, **factory) for _ in range(num_layers)
        )
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.blocks[0].attention

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
            # One set of RoPE tables per step, shared by every layer.
            rotary = self.blocks[0].attention.rotary_tables(cu_seqlens, h.shape[0], h.dtype)
        for block in self.blocks:
            h = block(h, cu_seqlens, max_seqlen, rotary)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))
