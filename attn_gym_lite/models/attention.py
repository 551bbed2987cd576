"""The seed's ``VarLenAttention``: QKV projection, packed attention, output projection.

It takes a packed batch: activations ``[T, dim]`` whose first ``L = cu_seqlens[-1]`` rows are
real tokens and whose remaining ``T - L`` rows are inactive capacity (padding a captured graph
still computes on). Projections are token-parallel and do not care about sequence boundaries;
only attention reads ``cu_seqlens``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..checks import check_bool, check_choice, check_factory, check_features
from ..ops.attention import IMPLEMENTATIONS, TRITON_HEAD_DIMS, needs_max_seqlen, varlen_attention
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens
from ..ops.rotary import apply_rotary, check_base, rotary_tables
from ..ragged import positions_in_sequence
from ..schedule import SCHEDULES

Tensor = torch.Tensor


def check_heads(owner: str, dim: object, num_heads: object, impl: str | None = None, *,
                rotary: bool = False) -> tuple[int, int]:
    """``(dim, num_heads)`` with ``dim`` a positive multiple of ``num_heads``, for
    ``impl="triton"`` a head dim ``dim // num_heads`` the kernels support
    (:data:`~attn_gym_lite.ops.attention.TRITON_HEAD_DIMS`), and with ``rotary`` an even head dim
    (RoPE rotates channel pairs), so a model is refused where it is built rather than at its
    first forward.

    Raises:
        TypeError / ValueError: naming ``owner`` and both values (and the head dim they give).
    """
    for name, value in (("dim", dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}")
    if num_heads < 1 or dim < 1 or dim % num_heads:
        raise ValueError(f"{owner}: dim must be a positive multiple of num_heads, got dim={dim!r}, num_heads={num_heads!r}")
    if impl == "triton" and dim // num_heads not in TRITON_HEAD_DIMS:
        raise ValueError(
            f"{owner}: impl='triton' needs a head dim dim // num_heads in {TRITON_HEAD_DIMS}, got dim={dim}, "
            f"num_heads={num_heads}: head dim {dim // num_heads}"
        )
    if rotary and (dim // num_heads) % 2:
        raise ValueError(
            f"{owner}: rotary position embeddings need an even head dim dim // num_heads, got dim={dim}, "
            f"num_heads={num_heads}: head dim {dim // num_heads}"
        )
    return dim, num_heads


class VarLenAttention(nn.Module):
    """QKV projection -> (RoPE) -> packed multi-head attention -> output projection.

    Args:
        dim: model width; must be divisible by ``num_heads``.
        num_heads: attention heads; head dim is ``dim // num_heads`` (16, 32, 64 or 128 for the
            Triton kernels; the head dims FlashAttention-2 supports for ``"varlen_attn"``).
        causal: causal attention within each sequence.
        mask_inactive_capacity: make rows past ``L`` harmless, with the masks of
            :mod:`attn_gym_lite.ops.masking` placed by its rule (mask where inactive rows can mix,
            reduce, or become undefined): a value mask on the input, because the QKV weight
            gradient ``Xᵀ∇Y`` sums over every row and the rows past ``L`` may hold anything; a
            gradient barrier on the QKV projection's output, because the attention kernels leave
            the q/k/v gradients of those rows unspecified; a value mask on the attention output,
            whose rows past ``L`` are unspecified, before the output projection reads them. The
            output's inactive rows are then 0 and the gradients equal those of the exact
            computation on the ``L`` real rows alone. On by default: needed whenever ``L < T``,
            i.e. under a graph captured at token capacity; with it the kernels need not zero those rows.
        impl: the attention implementation (:func:`attn_gym_lite.ops.attention.varlen_attention`):
            ``"auto"`` (this package's Triton kernels wherever they run, else the reference),
            ``"triton"``, ``"varlen_attn"`` (torch's FlashAttention-2), ``"reference"`` or
            ``"sdpa"`` (dense attention over a padded batch, the baseline packing replaces).
            ``"triton"`` needs a head dim in 16, 32, 64, 128 (refused here otherwise). With
            ``"auto"`` a head dim outside those (or a dtype other than bf16/fp16 on the GPU)
            falls back to the reference path, which reads ``cu_seqlens`` on the host and so
            cannot be captured in a CUDA graph (a capture raises a RuntimeError saying so).
        schedule: the Triton schedule (default ``"auto"``).
        rotary: apply rotary position embeddings to q and k, with positions that restart at every
            sequence (:mod:`attn_gym_lite.ops.rotary`).
        rope_base: the RoPE base (``10000``).
        device, dtype: of the parameters.

    Shapes: ``forward(x [T, dim], cu_seqlens int32 [N + 1], max_seqlen=None, rotary=None) -> [T, dim]``.
    ``max_seqlen`` (an int ``>=`` the longest sequence) is needed only where :attr:`needs_max_seqlen`;
    ``rotary`` optionally passes precomputed ``(cos, sin)`` tables (a model shares one set across
    its layers). The module trusts ``max_seqlen``: validate batches on the host
    (:class:`~attn_gym_lite.graph.training.FixedCapacityTrainer` does) or call
    :func:`~attn_gym_lite.ops.attention.varlen_attention` directly, which checks it.

    Raises:
        ValueError: ``dim`` is not a positive multiple of ``num_heads``; ``impl="triton"`` with a
            head dim ``dim // num_heads`` not in 16, 32, 64, 128, or ``rotary`` with an odd one
            (the message names ``dim``, ``num_heads`` and the head dim); ``impl`` or ``schedule`` unknown; ``rope_base`` not
            a finite number ``> 1`` (the check :func:`~attn_gym_lite.ops.rotary.rotary_tables`
            makes, here at construction rather than at the first forward); a ``device`` that
            torch does not parse or this host does not have (``"cuda"`` without a GPU; see
            :func:`~attn_gym_lite.checks.check_device`).
        TypeError: a flag is not a bool; ``rope_base`` is not a real number; ``device`` not a
            str, int or ``torch.device``; ``dtype`` not a floating ``torch.dtype``.
        TypeError / ValueError: in ``forward``, ``x`` not a ``[T, dim]`` tensor in the parameters'
            dtype and on their device (:func:`~attn_gym_lite.checks.check_features`; metadata
            only, so ``forward`` stays capturable), or a ``cu_seqlens`` of the wrong layout.

    Source: the seed article, "Hello World" (module) and "Correctness tangent" (masking).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        mask_inactive_capacity: bool = True,
        impl: str = "auto",
        schedule: str = "auto",
        rotary: bool = False,
        rope_base: float = 10000.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.impl = check_choice("impl", impl, ("auto", *IMPLEMENTATIONS))
        self.rotary = check_bool("rotary", rotary)
        self.dim, self.num_heads = check_heads("VarLenAttention", dim, num_heads, impl, rotary=self.rotary)
        self.head_dim = dim // num_heads
        self.causal = check_bool("causal", causal)
        self.mask_inactive_capacity = check_bool("mask_inactive_capacity", mask_inactive_capacity)
        self.schedule = check_choice("schedule", schedule, SCHEDULES)
        # Checked here even when rotary is False: a bad base is a slip whether or not it is used.
        self.rope_base = check_base("rope_base", rope_base)
        factory = check_factory(device, dtype)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False, **factory)
        self.out_proj = nn.Linear(dim, dim, bias=False, **factory)

    @property
    def needs_max_seqlen(self) -> bool:
        """Whether this module's attention sizes its work by ``max_seqlen`` (``"varlen_attn"``, or
        the Triton ``"rect"`` schedule): then a graph bakes the bound in at capture."""
        return needs_max_seqlen(self.impl, self.schedule)

    def rotary_tables(self, cu_seqlens: Tensor, tokens: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` for this batch: positions restart at every sequence."""
        return rotary_tables(positions_in_sequence(cu_seqlens, tokens), self.head_dim, base=self.rope_base, dtype=dtype)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None,
                rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        check_features("x", x, self.dim, like=self.qkv.weight, name="dim")  # metadata only: capturable
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
        if self.rotary:
            cos, sin = rotary if rotary is not None else self.rotary_tables(cu_seqlens, tokens, q.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attn = varlen_attention(q, k, v, cu_seqlens, impl=self.impl, schedule=self.schedule, causal=self.causal,
                                max_seqlen=max_seqlen if self.needs_max_seqlen else None, validate=False)
        if active is not None:
            attn = mask_inactive_tokens(attn, active)
        return self.out_proj(attn.reshape(tokens, self.dim))
