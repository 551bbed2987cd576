"""Cutting long documents into pieces that fit a batch.

A packed batch holds at most ``T`` tokens, so a document longer than the longest allowed piece
``S`` (the context length, ``S <= T``) has to be cut. The boundary rule used everywhere in this
package: a document of ``n`` tokens becomes the pieces ``[0, S), [S, 2S), ...``, i.e.
``ceil(n / S)`` consecutive slices, all of exactly ``S`` tokens except the last, which holds the
remaining ``n - (ceil(n / S) - 1) * S`` tokens (between 1 and ``S``). Concatenating the pieces
gives the document back: no token is lost or duplicated, and an empty document gives no piece.

Each piece becomes its own sequence, so the last token of a piece gets no next-token target:
cutting costs one target per cut, which is why ``S`` should not be much smaller than typical
documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from ..checks import check_int

__all__ = ["segment", "segment_lengths"]

Ids = TypeVar("Ids", bound=Sequence[int])


def segment(ids: Ids, max_piece_tokens: int) -> list[Ids]:
    """Cut one tokenized document into consecutive pieces of at most ``max_piece_tokens``.

    Args:
        ids: the document's token ids (any sliceable sequence: list, tuple, 1-D tensor).
        max_piece_tokens: ``S``, the longest piece (tokens), >= 1.

    Returns:
        ``ceil(len(ids) / S)`` slices of ``ids`` (same type), in order; every one has ``S``
        tokens except the last (1 to ``S``). ``[]`` for an empty document.

    Raises:
        TypeError, ValueError: ``max_piece_tokens`` is not an int >= 1.
        TypeError: ``ids`` is not a sliceable sequence of ids (a string, a dict, a set, ``None``,
            a 0-d tensor or array), named ``ids``.
    """
    size = check_int("max_piece_tokens", max_piece_tokens, minimum=1)
    # A sequence or a 1-D tensor/array; a string would be cut into substrings, a dict sliced.
    if isinstance(ids, (str, bytes)) or not (isinstance(ids, Sequence) or getattr(ids, "ndim", None) == 1):
        raise TypeError(f"ids must be a sliceable sequence of token ids (a list, tuple or 1-D tensor or array), got "
                        f"{type(ids).__name__}: {ids!r:.60}")
    return [ids[start : start + size] for start in range(0, len(ids), size)]


def segment_lengths(length: int, max_piece_tokens: int) -> list[int]:
    """The piece lengths :func:`segment` produces for a document of ``length`` tokens.

    ``segment_lengths(n, S) == [len(p) for p in segment(range(n), S)]``, computed without the
    tokens: ``n // S`` pieces of ``S``, then the remainder ``n % S`` if it is not zero.

    Raises:
        TypeError, ValueError: ``length`` is not an int >= 0 or ``max_piece_tokens`` not >= 1.
    """
    length = check_int("length", length, minimum=0)
    size = check_int("max_piece_tokens", max_piece_tokens, minimum=1)
    full, rest = divmod(length, size)
    return [size] * full + ([rest] if rest else [])
