"""Cutting long documents into pieces of at most ``S <= T`` tokens: the slices ``[0, S), [S, 2S),
...``. Each piece becomes its own sequence, so cutting costs one next-token target per cut."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["MIN_DOCUMENT_TOKENS", "segment", "segment_lengths"]

#: Shorter documents are dropped by the loader and the study: one token has no next-token target.
MIN_DOCUMENT_TOKENS = 2

Ids = TypeVar("Ids", bound=Sequence[int])


def segment(ids: Ids, max_piece_tokens: int) -> list[Ids]:
    """``ceil(len(ids) / S)`` consecutive slices of ``ids`` (same type), all of ``S`` tokens but the last."""
    return [ids[start : start + max_piece_tokens] for start in range(0, len(ids), max_piece_tokens)]


def segment_lengths(length: int, max_piece_tokens: int) -> list[int]:
    """``[len(p) for p in segment(range(length), max_piece_tokens)]``, without the tokens."""
    full, rest = divmod(length, max_piece_tokens)
    return [max_piece_tokens] * full + ([rest] if rest else [])
