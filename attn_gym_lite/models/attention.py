"""The seed's ``VarLenAttention``: QKV projection, packed attention, output projection.

It takes activations ``[T, dim]`` whose first ``L = cu_seqlens[-1]`` rows are real tokens and
whose other ``T - L`` rows are inactive capacity (padding a captured graph still computes on).
The projections are token-parallel; only attention reads ``cu_seqlens``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import TRITON_HEAD_DIMS, needs_max_seqlen, varlen_attention
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens
from ..ops.rotary import apply_rotary, rotary_tables
from ..ragged import positions_in_sequence

Tensor = torch.Tensor


def check_heads(owner: str, dim: int, num_heads: int, impl: str | None = None, *, rotary: bool = False) -> None:
    """Refuse, where a model is built, a ``dim`` that is not a multiple of ``num_heads``, a head dim
    the Triton kernels lack for ``impl="triton"``, or an odd head dim with RoPE."""
    head_dim = dim // num_heads if num_heads > 0 else 0
    if dim < 1 or num_heads < 1 or dim % num_heads or (impl == "triton" and head_dim not in TRITON_HEAD_DIMS) \
            or (rotary and head_dim % 2):
        raise ValueError(f"{owner}: dim={dim} and num_heads={num_heads} give head dim {head_dim}, which "
                         f"{'impl=triton' if impl == 'triton' else 'this model'} cannot use")


class VarLenAttention(nn.Module):
    """QKV projection -> (RoPE) -> packed multi-head attention -> output projection.

    Args:
        dim, num_heads: model width and heads (head dim ``dim // num_heads``).
        causal: causal attention within each sequence.
        mask_inactive_capacity: make rows past ``L`` harmless (on by default, so that the module
            is exact on a padded batch whatever those rows hold): a value mask on the input
            (the QKV weight gradient ``Xᵀ∇Y`` sums every row), a gradient barrier on the QKV
            output (the kernels leave the q/k/v gradients of those rows unspecified) and a value
            mask on the attention output (its rows past ``L`` are unspecified). The "Masking"
            chapter proves the placement.
        impl, schedule: the attention implementation and Triton schedule
            (:func:`attn_gym_lite.ops.attention.varlen_attention`).
        rotary, rope_base: rotary position embeddings on q and k, positions restarting at every
            sequence.
        device, dtype: of the parameters.

    ``forward(x [T, dim], cu_seqlens int32 [N + 1], max_seqlen=None, rotary=None) -> [T, dim]``;
    ``max_seqlen`` only where :attr:`needs_max_seqlen`; ``rotary`` optional precomputed
    ``(cos, sin)`` tables shared by a model's layers.

    Source: the seed article, "Hello World" (module) and "Correctness tangent" (masking).
    """

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, mask_inactive_capacity: bool = True,
                 impl: str = "auto", schedule: str = "auto", rotary: bool = False, rope_base: float = 10000.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_heads("VarLenAttention", dim, num_heads, impl, rotary=rotary)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.causal, self.mask_inactive_capacity = causal, mask_inactive_capacity
        self.impl, self.schedule, self.rotary, self.rope_base = impl, schedule, rotary, rope_base
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, device=device, dtype=dtype)
        self.out_proj = nn.Linear(dim, dim, bias=False, device=device, dtype=dtype)

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether the attention sizes its work by ``max_seqlen``: a graph then bakes it in."""
        return needs_max_seqlen(self.impl, self.schedule)

    def rotary_tables(self, cu_seqlens: Tensor, tokens: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` for this batch: positions restart at every sequence."""
        return rotary_tables(positions_in_sequence(cu_seqlens, tokens), self.head_dim, base=self.rope_base, dtype=dtype)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None,
                rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        tokens = x.shape[0]
        active = None
        if self.mask_inactive_capacity:
            active = active_token_mask(x, cu_seqlens)  # from cu_seqlens[-1] on the device: replays rebuild it
            x = mask_inactive_tokens(x, active)
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        if active is not None:
            qkv = mask_inactive_token_gradients(qkv, active)
        q, k, v = qkv.unbind(dim=1)
        if self.rotary:
            cos, sin = rotary if rotary is not None else self.rotary_tables(cu_seqlens, tokens, q.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attn = varlen_attention(q, k, v, cu_seqlens, impl=self.impl, schedule=self.schedule, causal=self.causal,
                                max_seqlen=max_seqlen if self.needs_max_seqlen else None, validate=False)
        if active is not None:
            attn = mask_inactive_tokens(attn, active)
        return self.out_proj(attn.reshape(tokens, self.dim))
