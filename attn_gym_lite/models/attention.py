"""The seed's ``VarLenAttention``: QKV projection, packed attention, output projection.

It takes a packed batch: activations ``[T, dim]`` whose first ``L = cu_seqlens[-1]`` rows are
real tokens and whose remaining ``T - L`` rows are inactive capacity (padding a captured graph
still computes on). Projections are token-parallel and do not care about sequence boundaries;
only attention reads ``cu_seqlens``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import varlen_attention
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens

Tensor = torch.Tensor


class VarLenAttention(nn.Module):
    """QKV projection -> packed multi-head attention -> output projection.

    Args:
        dim: model width; must be divisible by ``num_heads``.
        num_heads: attention heads; head dim is ``dim // num_heads`` (the CUDA path supports the
            head dims FlashAttention-2 does, e.g. 64 and 128).
        causal: causal attention within each sequence.
        mask_inactive_capacity: make rows past ``L`` harmless, with the masks of
            :mod:`attn_gym_lite.masking` placed by its rule (mask where inactive rows can mix,
            reduce, or become undefined): a value mask on the input, because the QKV weight
            gradient ``Xᵀ∇Y`` sums over every row and the rows past ``L`` may hold anything; a
            gradient barrier on the QKV projection's output, because torch's ``varlen_attn``
            returns undefined (NaN) q/k/v gradients for those rows; a value mask on the attention
            output, whose rows past ``L`` are undefined, before the output projection reads them.
            The output's inactive rows are then 0 and the gradients equal those of the exact
            computation on the ``L`` real rows alone. Needed whenever ``L < T``, i.e. under a
            graph captured at token capacity.

    Shapes: ``forward(x [T, dim], cu_seqlens int32 [N + 1], max_seqlen int) -> [T, dim]``.

    Source: the seed article, "Hello World" (module) and "Correctness tangent" (masking).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        mask_inactive_capacity: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(
                f"VarLenAttention: dim must be a positive multiple of num_heads, got dim={dim}, "
                f"num_heads={num_heads}"
            )
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.causal = causal
        self.mask_inactive_capacity = mask_inactive_capacity
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, device=device, dtype=dtype)
        self.out_proj = nn.Linear(dim, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
        tokens = x.shape[0]
        active = None
        if self.mask_inactive_capacity:
            # Built on the device from cu_seqlens[-1]: a captured graph rebuilds it every replay.
            active = active_token_mask(x, cu_seqlens)
            x = mask_inactive_tokens(x, active)
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        if active is not None:
            qkv = mask_inactive_token_gradients(qkv, active)
        q, k, v = qkv.unbind(dim=1)
        attn = varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=self.causal)
        if active is not None:
            attn = mask_inactive_tokens(attn, active)
        return self.out_proj(attn.reshape(tokens, self.dim))
