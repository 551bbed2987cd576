"""A token-mixing block with a short convolution and packed attention, masked exactly where needed.

::

    x ─► [input: value mask] ─► RMSNorm ─► QKV projection ─► [qkv_grad: gradient barrier]
      ─► short conv (ragged) ─► SiLU ─► causal varlen attention (ragged)
      ─► [attention_output: value mask] ─► RMSNorm ─► output projection ─► + x

A linear-attention layer's shape with softmax attention as the mixer. Masks, by the rule *mask
where inactive rows can mix, reduce, or become undefined, and nowhere else*: ``input`` (rows past
``L`` may hold NaN; the first norm's and QKV's weight gradients sum every row), ``qkv_grad`` (the
short convolution leaves its inactive input-gradient rows undefined), ``attention_output`` (so does
varlen attention with its output rows). Everything else is token-parallel or ragged.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..ops.attention import needs_max_seqlen, varlen_attention
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens
from ..ops.short_conv import ShortConv
from .attention import check_heads

Tensor = torch.Tensor

__all__ = ["MASK_SITES", "ShortConvAttentionBlock"]

#: Where :class:`ShortConvAttentionBlock` masks, in forward order.
MASK_SITES = ("input", "qkv_grad", "attention_output")


class ShortConvAttentionBlock(nn.Module):
    """Pre-norm residual block: ``forward(x [T, dim], cu_seqlens, max_seqlen=None) -> [T, dim]``.

    ``masks``: the sites of :data:`MASK_SITES` to apply, fewer only to see what each prevents.
    ``impl``, ``schedule``: the attention's, as in :class:`~attn_gym_lite.models.attention.VarLenAttention`;
    ``max_seqlen`` bounds the longest sequence where the attention sizes its grid by it.
    """

    def __init__(self, dim: int, num_heads: int, *, kernel_size: int = 4, masks: Iterable[str] = MASK_SITES,
                 impl: str = "auto", schedule: str = "auto", device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_heads("ShortConvAttentionBlock", dim, num_heads, impl)
        self.masks = frozenset(masks)
        if not self.masks <= set(MASK_SITES):  # a misspelt site would silently switch its mask off
            raise ValueError(f"masks must be sites from {MASK_SITES}, got unknown {sorted(self.masks - set(MASK_SITES))}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.impl, self.schedule = impl, schedule
        factory = dict(device=device, dtype=dtype)
        self.norm_in = nn.RMSNorm(dim, **factory)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, **factory)
        self.conv = ShortConv(3 * dim, kernel_size, activation="silu", **factory)
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.out_proj = nn.Linear(dim, dim, bias=False, **factory)

    @property
    def needs_max_seqlen(self) -> bool:  # whether the attention sizes its work by max_seqlen
        return needs_max_seqlen(self.impl, self.schedule)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        tokens = x.shape[0]
        # One mask per forward, from the device value cu_seqlens[-1]; every site below reuses it.
        active = active_token_mask(x, cu_seqlens)
        if "input" in self.masks:
            x = mask_inactive_tokens(x, active)
        qkv = self.qkv(self.norm_in(x))
        if "qkv_grad" in self.masks:
            qkv = mask_inactive_token_gradients(qkv, active)
        qkv = self.conv(qkv, cu_seqlens)  # SiLU fused into the convolution
        q, k, v = qkv.view(tokens, 3, self.num_heads, self.head_dim).unbind(dim=1)
        attn = varlen_attention(q, k, v, cu_seqlens, impl=self.impl, schedule=self.schedule, causal=True,
                                max_seqlen=max_seqlen if self.needs_max_seqlen else None, validate=False)
        if "attention_output" in self.masks:
            attn = mask_inactive_tokens(attn, active)
        return x + self.out_proj(self.norm_out(attn.reshape(tokens, self.dim)))
