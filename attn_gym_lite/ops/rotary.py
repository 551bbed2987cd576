"""Rotary position embeddings (RoPE) for packed batches: positions restart at every sequence.

Positions come from :func:`attn_gym_lite.ragged.positions_in_sequence`, so a packed document sees
the rotations it would see alone. "Rotate half" convention (GPT-NeoX, Llama); Su et al., RoFormer.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

__all__ = ["apply_rotary", "check_base", "rotary_tables"]


def check_base(argument: str, base: float) -> float:
    """The RoPE base as a float ``> 1`` (at 1 every angle is the position; below, frequencies grow)."""
    if not 1 < float(base) < float("inf"):
        raise ValueError(f"{argument} must be a finite real number > 1.0, got {base!r}")
    return float(base)


def rotary_tables(positions: Tensor, head_dim: int, *, base: float = 10000.0,
                  dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``[T, head_dim / 2]`` in ``dtype``, for integer ``positions [T]``.

    Angles are formed in float32 (they reach ``T`` radians; bfloat16 would lose them), then cast.
    """
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    angles = positions.to(torch.float32)[:, None] * base ** -exponents[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [T, H, D]`` by the tables of :func:`rotary_tables`; token-parallel."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
