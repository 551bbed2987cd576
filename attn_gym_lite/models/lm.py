"""Packed language models: the one-block ``PackedLM`` of the training-loop chapter.

A packed batch is ``input_ids [T]`` whose first ``L = cu_seqlens[-1]`` rows are real tokens and
whose remaining ``T - L`` rows are inactive capacity; the loss selects the rows ``loss_mask``
names, so inactive rows never reach it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..regions import mark_kernels
from .attention import VarLenAttention

Tensor = torch.Tensor


class PackedLM(nn.Module):
    """A one-block causal language model over packed batches, for the training-loop chapter.

    embedding -> RMSNorm -> causal ``VarLenAttention`` (residual) -> RMSNorm -> LM head.
    Inactive capacity is masked inside the attention, so ``loss`` is exactly the mean next-token
    cross-entropy over the positions where ``loss_mask`` is True.

    Args:
        vocab_size: tokenizer vocabulary size.
        dim, num_heads: attention width and heads.
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        num_heads: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, device=device, dtype=dtype)
        self.norm_in = nn.RMSNorm(dim, device=device, dtype=dtype)
        self.attention = VarLenAttention(
            dim, num_heads, causal=True, mask_inactive_capacity=True, device=device, dtype=dtype
        )
        self.norm_out = nn.RMSNorm(dim, device=device, dtype=dtype)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, device=device, dtype=dtype)

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
        """``input_ids`` int64 ``[T]`` -> logits ``[T, vocab_size]``."""
        # Named regions: record_function ranges in eager traces, and labels on the kernels of a
        # captured graph (see attn_gym_lite.profiling).
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
        with mark_kernels("attention"):
            h = h + self.attention(self.norm_in(h), cu_seqlens, max_seqlen)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))

    def loss(
        self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor, max_seqlen: int
    ) -> Tensor:
        """Mean cross-entropy over ``loss_mask`` (bool ``[T]``); a float32 scalar, no host sync.

        An all-False mask gives 0 rather than NaN (the denominator is clamped to 1).
        """
        logits = self(input_ids, cu_seqlens, max_seqlen)
        with mark_kernels("loss"):
            token_losses = F.cross_entropy(logits.float(), labels, reduction="none")
            # Select, never multiply: a garbage logit on a masked row must not become NaN * 0.
            total = torch.where(loss_mask, token_losses, 0.0).sum()
            return total / loss_mask.sum().clamp_min(1)
