"""Rotary position embeddings (RoPE) for packed batches: positions restart at every sequence.

In a packed batch, row ``t`` of sequence ``i`` sits at position ``t - cu_seqlens[i]`` of its own
document (:func:`attn_gym_lite.ragged.positions_in_sequence`), not at ``t``: a document packed
after another must see the same rotations it would see alone. The tables are built on the device
from ``cu_seqlens``, so a captured graph rebuilds them for every replay's layout.

Convention: the "rotate half" form of GPT-NeoX and Llama: the head dim is split into halves
``(x1, x2)`` and rotated by ``angle = position * base ** (-2 j / D)``.

Source: Su et al., "RoFormer" (2021); the packed-position convention of FlashAttention's varlen
training examples.
"""

from __future__ import annotations

import torch

from ..checks import check_int, check_real, check_tensor

Tensor = torch.Tensor

__all__ = ["apply_rotary", "check_base", "rotary_tables"]


def check_base(argument: str, base: object) -> float:
    """``base`` as a float: the RoPE base must be a finite real number ``> 1`` (at 1 every angle is
    the position itself, below 1 the frequencies grow with the dimension).

    Raises:
        TypeError: not a real number (``bool`` included).
        ValueError: NaN, infinite, or ``<= 1``.
    """
    return check_real(argument, base, above=1.0)


def rotary_tables(positions: Tensor, head_dim: int, *, base: float = 10000.0,
                  dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``[T, head_dim / 2]`` in ``dtype``, for integer ``positions [T]``.

    Computed in float32 (angles reach ``T`` radians; bf16 would lose them), then cast.

    Raises:
        TypeError / ValueError: ``positions`` is not a 1-D integer tensor, ``head_dim`` not an even
            int ``>= 2``, ``base`` not a finite number ``> 1``.
    """
    check_tensor("positions", positions, ndim=1, shape="[T]", dtypes=(torch.int32, torch.int64))
    head_dim = check_int("head_dim", head_dim, minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be an even int >= 2, got {head_dim}")
    base = check_base("base", base)
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    angles = positions.to(torch.float32)[:, None] * base ** -exponents[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [T, H, D]`` by the tables of :func:`rotary_tables` (``[T, D / 2]`` each).

    Token-parallel (row ``t`` reads only row ``t``), differentiable, capture-safe.

    Raises:
        ValueError: the tables do not have shape ``[T, D / 2]``.
    """
    half = x.shape[-1] // 2
    if cos.shape != (x.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(
            f"cos and sin must have shape [T, D / 2] = {(x.shape[0], half)}, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
