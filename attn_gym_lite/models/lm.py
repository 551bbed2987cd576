"""Packed language models: the one-block ``PackedLM`` of the training-loop chapter and the
``PackedTransformer`` that chapter 8 trains with the whole stack.

``input_ids [T]`` hold ``L = cu_seqlens[-1]`` real tokens, then ``T - L`` rows of inactive
capacity; the loss counts only the rows ``loss_mask`` selects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..regions import mark_kernels
from .attention import VarLenAttention, check_heads

Tensor = torch.Tensor

_NO_IGNORED_LABEL = torch.iinfo(torch.int64).min  # cross_entropy's ignore_index, out of reach


def token_loss_sum(logits: Tensor, labels: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(sum of next-token cross-entropies over the rows loss_mask selects, their count)``: the
    numerator and denominator of :func:`packed_lm_loss`, kept apart so that the count can be summed
    over ranks (:func:`~attn_gym_lite.graph.distributed.global_token_mean_loss`).

    Rows outside ``loss_mask`` are *selected* away, never multiplied by 0 (a garbage logit there
    must not become ``NaN * 0``). No label is ignorable: a ``-100`` on a counted row fails in
    cross-entropy (an error on the CPU, a device-side assert on CUDA) instead of counting as zero.
    No host sync: capturable. ``total`` is float32 for half-precision logits, ``count`` int64.
    """
    targets = torch.where(loss_mask, labels, 0)
    losses = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets,
                             reduction="none", ignore_index=_NO_IGNORED_LABEL)
    return torch.where(loss_mask, losses, 0.0).sum(), loss_mask.sum(dtype=torch.int64)


def packed_lm_loss(logits: Tensor, labels: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean next-token cross-entropy over the rows ``loss_mask`` selects (0 for none), in nats."""
    total, count = token_loss_sum(logits, labels, loss_mask)
    return total / count.clamp_min(1)


class _PackedLanguageModel(nn.Module):
    """The loss over ``loss_mask`` and ``needs_max_seqlen``, shared by the models below; subclasses
    define ``_attention`` and ``_logits``."""

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether the attention sizes its work by ``max_seqlen`` (then a graph bakes it in)."""
        return self._attention().needs_max_seqlen

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        """Logits ``[T, vocab_size]`` of a packed batch (``input_ids`` int64 ``[T]``)."""
        return self._logits(input_ids, cu_seqlens, max_seqlen)

    def loss(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor, cu_seqlens: Tensor,
             max_seqlen: int | None = None) -> Tensor:
        """Mean cross-entropy over ``loss_mask`` (:func:`packed_lm_loss`). A CPU ``loss_mask``
        counting a row at or past ``L`` is refused (the mean would count capacity rows); a CUDA one
        is trusted (reading it would sync): :class:`~attn_gym_lite.data.PackedBatch` checks it."""
        logits = self(input_ids, cu_seqlens, max_seqlen)
        if loss_mask.device.type == "cpu" and cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling() \
                and loss_mask[int(cu_seqlens[-1]):].any():
            raise ValueError("loss_mask must be False on the inactive rows L..T-1 (L = cu_seqlens[-1])")
        with mark_kernels("loss"):
            return packed_lm_loss(logits, labels, loss_mask)


class PackedLM(_PackedLanguageModel):
    """A one-block causal language model for the training-loop chapter: embedding -> RMSNorm ->
    causal :class:`VarLenAttention` (residual, masked) -> RMSNorm -> LM head."""

    def __init__(self, vocab_size: int, dim: int, num_heads: int, *, impl: str = "auto", schedule: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.norm_in = nn.RMSNorm(dim, **factory)
        self.attention = VarLenAttention(dim, num_heads, causal=True, impl=impl, schedule=schedule, **factory)
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.attention

    def _logits(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None) -> Tensor:
        # Named regions: ranges in eager traces, labels on a captured graph's kernels (profiling).
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
        with mark_kernels("attention"):
            h = h + self.attention(self.norm_in(h), cu_seqlens, max_seqlen)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h + attention(RMSNorm(h))``, then ``h + MLP(RMSNorm(h))``.

    The attention is causal with RoPE and its inactive-capacity masks. The SwiGLU MLP
    (``down(silu(gate) * up)``) is token-parallel and needs no mask: an inactive row only changes
    itself, and every row it sees is finite in a :class:`PackedTransformer` (the embedding of any
    id is finite, the attention output is masked).
    """

    def __init__(self, dim: int, num_heads: int, hidden: int, *, impl: str, schedule: str,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.norm_attention = nn.RMSNorm(dim, **factory)
        self.attention = VarLenAttention(dim, num_heads, causal=True, impl=impl, schedule=schedule, rotary=True,
                                         **factory)
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
    """A decoder-only transformer over packed batches (chapter 8's model): embedding,
    ``num_layers`` :class:`TransformerBlock` s (RMSNorm, causal attention with RoPE restarting at
    every document, SwiGLU), RMSNorm, LM head.

    Args:
        vocab_size: tokenizer vocabulary size.
        dim, num_heads, num_layers: width, heads (head dim ``dim // num_heads``, even) and depth.
        mlp_ratio: the SwiGLU hidden width is ``mlp_ratio * dim`` rounded up to a multiple of 64.
        impl, schedule: the attention implementation and Triton schedule
            (:func:`~attn_gym_lite.ops.attention.varlen_attention`); ``"auto"`` is the package's
            kernels wherever they run.
        device, dtype: of the parameters.

    ``forward(input_ids int64 [T], cu_seqlens int32 [N + 1], max_seqlen=None) -> [T, vocab_size]``;
    ``loss(input_ids, labels, loss_mask, cu_seqlens, max_seqlen=None)`` is the mean cross-entropy
    over ``loss_mask``, exactly that of the ``L`` real rows alone.

    Source: the Llama architecture (RMSNorm, RoPE, SwiGLU), packed as in the seed article.
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, num_layers: int, *, mlp_ratio: float = 8 / 3,
                 impl: str = "auto", schedule: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        check_heads("PackedTransformer", dim, num_heads, impl, rotary=True)
        hidden = -(-int(mlp_ratio * dim) // 64) * 64
        factory = {"device": device, "dtype": dtype}
        self.embedding = nn.Embedding(vocab_size, dim, **factory)
        self.blocks = nn.ModuleList(TransformerBlock(dim, num_heads, hidden, impl=impl, schedule=schedule, **factory)
                                    for _ in range(num_layers))
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False, **factory)

    def _attention(self) -> VarLenAttention:
        return self.blocks[0].attention

    def _logits(self, input_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int | None) -> Tensor:
        with mark_kernels("embedding"):
            h = self.embedding(input_ids)
            rotary = self.blocks[0].attention.rotary_tables(cu_seqlens, h.shape[0], h.dtype)  # shared by every layer
        for block in self.blocks:
            h = block(h, cu_seqlens, max_seqlen, rotary)
        with mark_kernels("lm head"):
            return self.lm_head(self.norm_out(h))
