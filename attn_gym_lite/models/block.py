"""A token-mixing block with a short convolution and packed attention, masked exactly where needed.

::

    x ─► [input: value mask] ─► RMSNorm ─► QKV projection ─► [qkv_grad: gradient barrier]
      ─► short conv (ragged) ─► SiLU ─► causal varlen attention (ragged)
      ─► [attention_output: value mask] ─► RMSNorm ─► output projection ─► + x

The shape of a linear-attention layer (Mamba, DeltaNet, KDA: projections, short convolution, a
ragged token mixer, a norm, an output projection) with softmax attention as the mixer. Its three
masks follow one rule, *mask where inactive rows can mix, reduce, or become undefined, and
nowhere else*:

============================  =================  ================================================
site (``MASK_SITES`` name)    kind               why exactly here
============================  =================  ================================================
``input``                     value mask         the input's rows past ``L`` may hold anything
                                                 (NaN, Inf, stale data) and the first norm's
                                                 gain gradient and the QKV weight gradient both
                                                 sum over every row: ``NaN * 0 = NaN``
``qkv_grad``                  gradient barrier   the short convolution's backward leaves the
                                                 inactive rows of its input gradient undefined;
                                                 the QKV weight gradient ``hᵀ∇qkv`` would sum them
``attention_output``          value mask         varlen attention leaves its inactive output rows
                                                 undefined, and the output norm's gain gradient
                                                 and the output projection's weight gradient sum
                                                 over every row
============================  =================  ================================================

Nowhere else: the norms, projections and SiLU are token-parallel in the forward pass (an inactive
row only ever changes itself); the short convolution and the attention are ragged (their active
rows read only active rows, and their weight gradients, if any, sum over active rows only), so
their inactive inputs need no cleaning; and the undefined q/k/v gradients that attention returns
for inactive rows stop inside the short convolution's backward, which reads only active rows. The
block's output rows past ``L`` are exactly 0 and, with a loss that selects active rows, every
gradient equals the one computed on the ``L`` real rows alone (``tests/test_block.py`` proves it).

Source: the seed article, section "Correctness tangent" (mask placement in a KDA-style module).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..checks import check_choice, check_factory, check_features, check_subset
from ..ops.attention import IMPLEMENTATIONS, needs_max_seqlen, varlen_attention
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens
from ..ops.short_conv import ShortConv
from ..schedule import SCHEDULES
from .attention import check_heads

Tensor = torch.Tensor

__all__ = ["MASK_SITES", "ShortConvAttentionBlock"]

#: Where :class:`ShortConvAttentionBlock` masks, in forward order.
MASK_SITES = ("input", "qkv_grad", "attention_output")


class ShortConvAttentionBlock(nn.Module):
    """Pre-norm residual block: QKV projection, ragged short convolution, causal varlen attention.

    Args:
        dim: model width, a positive multiple of ``num_heads``.
        num_heads: attention heads; head dim ``dim // num_heads`` (the CUDA path needs a
            FlashAttention head dim, e.g. 64 or 128).
        kernel_size: width ``W`` of the short convolution over the ``3 * dim`` QKV channels.
        masks: which of :data:`MASK_SITES` to apply. The default, all of them, is what training
            at padded capacity needs; leave sites out only to see what each one prevents (the
            "Masking" chapter does).
        impl, schedule: the attention implementation and Triton schedule, as in
            :class:`~attn_gym_lite.models.attention.VarLenAttention`.
        device, dtype: of the parameters.

    Shapes: ``forward(x [T, dim], cu_seqlens int32 [N + 1], max_seqlen=None) -> [T, dim]``, in
    the parameters' dtype. ``max_seqlen`` bounds the longest sequence where the attention needs it
    (:attr:`needs_max_seqlen`: it sizes its grid from it; under a graph pass ``T``).

    Raises:
        ValueError: ``dim`` is not a positive multiple of ``num_heads`` (or, for ``impl="triton"``,
            gives a head dim not in 16, 32, 64, 128), or ``masks`` names a site not in
            :data:`MASK_SITES`; a ``device`` torch does not parse or this host does not have
            (:func:`~attn_gym_lite.checks.check_device`).
        TypeError: ``masks`` is not an iterable of site names (a string or a dict is
            refused, :func:`~attn_gym_lite.checks.check_subset`); ``device`` not a
            str, int or ``torch.device``; ``dtype`` not a floating ``torch.dtype``.
        TypeError / ValueError: in ``forward``, ``x`` not a ``[T, dim]`` tensor in the parameters'
            dtype and on their device (:func:`~attn_gym_lite.checks.check_features`; metadata
            only, so ``forward`` stays capturable), or a ``cu_seqlens`` of the wrong layout.

    Capturable on CUDA: nothing in ``forward`` reads the device.
    Source: seed article, section "Correctness tangent"; flash-linear-attention's layers.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kernel_size: int = 4,
        masks: Iterable[str] = MASK_SITES,
        impl: str = "auto",
        schedule: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_heads("ShortConvAttentionBlock", dim, num_heads, impl)
        masks = check_subset("ShortConvAttentionBlock: masks", masks, MASK_SITES)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.masks = masks
        self.impl = check_choice("impl", impl, ("auto", *IMPLEMENTATIONS))
        self.schedule = check_choice("schedule", schedule, SCHEDULES)
        factory = check_factory(device, dtype)
        self.norm_in = nn.RMSNorm(dim, **factory)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, **factory)
        self.conv = ShortConv(3 * dim, kernel_size, activation="silu", **factory)
        self.norm_out = nn.RMSNorm(dim, **factory)
        self.out_proj = nn.Linear(dim, dim, bias=False, **factory)

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether the attention sizes its work by ``max_seqlen`` (see ``VarLenAttention``)."""
        return needs_max_seqlen(self.impl, self.schedule)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        check_features("x", x, self.dim, like=self.qkv.weight, name="dim")  # metadata only: capturable
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
