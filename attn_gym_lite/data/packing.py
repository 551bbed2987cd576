"""Packing policies: which pieces go into which batch of capacity ``T``.

A policy reads a stream of piece lengths (tokens, each ``1..T``) and groups the pieces into
batches; every piece lands in exactly one batch, and a batch holds ``M >= 1`` pieces of
``L <= T`` tokens in all. The ``T - L`` rows left over are padding the GPU computes for nothing,
so the policy decides how much of every step is wasted. Three policies:

* :class:`InOrder`: append pieces in stream order and close the batch when the next one does not
  fit. It never reorders, and it never looks ahead.
* :class:`FirstFit` and :class:`BestFit` with a candidate buffer of ``B`` pieces: a batch may
  choose from the ``B`` oldest pieces not yet packed, and never looks further (the seed
  article's candidate buffer). First-fit takes candidates oldest first whenever they fit;
  best-fit takes the largest candidate that fits, again and again.

The bound on ``M`` each policy guarantees is what sizes ``N``, the sequence capacity a CUDA graph
is captured with (``cu_seqlens`` has ``N + 1`` entries): in order, ``M <= T`` (pieces of one
token); with a buffer of ``B``, ``M <= min(B, T)`` by construction, whatever the data. A
``sequence_capacity`` passed to :meth:`PackingPolicy.batches` caps ``M`` further.

Policies work on lengths alone and yield *stream positions* (0-based indices of the pieces in
the order they arrived), so the same code packs a corpus sample's lengths in a study and real
token ids in a loader. Resuming: the batches still to come depend only on the pieces not yet
packed followed by the rest of the stream, so a loader that saves the unpacked pieces and feeds
them again first (in stream order) continues with exactly the batches it would have produced.

Source: seed article, "Show me the data!" (candidate-buffer look-ahead packing).
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

import torch

from ..checks import check_int

__all__ = ["PackingPolicy", "InOrder", "FirstFit", "BestFit"]


def _checked(lengths: Iterable[int], token_capacity: int) -> Iterator[tuple[int, int]]:
    """``(position, length)`` for each length, checking ``1 <= length <= T`` as it arrives."""
    for position, length in enumerate(lengths):
        # ints, numpy ints and 0-d integer tensors (a tensor's entries) pass; a bool (True would
        # count as 1 token), a float or a string is named.
        try:
            if isinstance(length, bool) or (isinstance(length, torch.Tensor) and length.dtype == torch.bool):
                raise TypeError
            length = operator.index(length)
        except TypeError:
            raise TypeError(f"lengths[{position}] must be an int, got {type(length).__name__} {length!r}") from None
        if not 0 < length <= token_capacity:
            raise ValueError(
                f"lengths[{position}] must be in 1..token_capacity={token_capacity}, "
                f"got {length} (cut long documents with segment() first)"
            )
        yield position, length


class PackingPolicy(ABC):
    """Groups a stream of piece lengths into batches of at most ``T`` tokens and ``N`` pieces."""

    name: str

    @property
    @abstractmethod
    def label(self) -> str:
        """Short human-readable name, e.g. ``"best-fit B=32"``."""

    @abstractmethod
    def _own_bound(self, token_capacity: int) -> int:
        """The policy's bound on ``M`` without a sequence cap."""

    def sequence_bound(self, token_capacity: int, sequence_capacity: int | None = None) -> int:
        """The largest ``M`` any batch of this policy can have, for every input stream.

        Args:
            token_capacity: ``T`` (tokens), >= 1.
            sequence_capacity: ``N``, a cap on ``M`` (>= 1), or None for no cap.

        Returns:
            ``min(policy bound, N)``: a sequence capacity that is enough by construction.

        Raises:
            TypeError, ValueError: ``T`` or ``N`` is not an int >= 1.
        """
        token_capacity = check_int("token_capacity", token_capacity, minimum=1)
        bound = self._own_bound(token_capacity)
        if sequence_capacity is None:
            return bound
        return min(bound, check_int("sequence_capacity", sequence_capacity, minimum=1))

    @abstractmethod
    def _batches(
        self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int
    ) -> Iterator[list[int]]:
        """Batches (increasing stream positions) from checked ``(position, length)`` items."""

    def batches(
        self,
        lengths: Iterable[int],
        token_capacity: int,
        sequence_capacity: int | None = None,
    ) -> Iterator[list[int]]:
        """Pack a stream of piece lengths; yield each batch as its pieces' stream positions.

        Args:
            lengths: piece lengths in tokens, each ``1..T``, in stream order (any iterable; it
                is read lazily, as far as the batches requested need).
            token_capacity: ``T`` (tokens), >= 1.
            sequence_capacity: ``N``, at most this many pieces per batch (>= 1), or None for the
                policy's own bound (:meth:`sequence_bound`).

        Yields:
            One list of stream positions per batch, in increasing order: the batch's pieces
            in the order they are laid out. Every position appears in exactly one batch; each
            batch has ``1 <= M <= sequence_bound(T, N)`` pieces and ``L <= T`` tokens.

        Raises:
            TypeError, ValueError: ``T`` or ``N`` is not an int >= 1, or ``lengths`` is not an
                iterable (a string is not one, nor a dict: its keys are not taken) (when called); a length is not an int (a ``bool``
                or a float included), or outside ``1..T`` (when it is reached).
        """
        token_capacity = check_int("token_capacity", token_capacity, minimum=1)
        slots = self.sequence_bound(token_capacity, sequence_capacity)
        if isinstance(lengths, (str, bytes)):
            raise TypeError(f"lengths must be an iterable of ints, got the string {lengths!r}")
        if isinstance(lengths, Mapping):  # iterating it would silently take its keys
            raise TypeError(f"lengths must be an iterable of ints, got a {type(lengths).__name__}: {lengths!r:.60}")
        try:
            lengths = iter(lengths)  # now, not at the first batch: a non-iterable is named at the call
        except TypeError:
            raise TypeError(f"lengths must be an iterable of ints, got {type(lengths).__name__}") from None
        return self._batches(_checked(lengths, token_capacity), token_capacity, slots)


@dataclass(frozen=True)
class InOrder(PackingPolicy):
    """Append pieces in stream order; close the batch when the next piece does not fit.

    The next piece opens a new batch when it would overflow the ``T - L`` rows left, or when the
    batch already has ``N`` pieces. Batches are consecutive runs of the stream, so order is kept
    exactly. Bound: ``M <= min(T, N)`` (without a cap, ``T`` pieces of one token fit), so a graph
    fed by this policy needs ``N = T`` unless the loader caps ``M``, which closes batches early.
    """

    name = "in-order"

    @property
    def label(self) -> str:
        return self.name

    def _own_bound(self, token_capacity: int) -> int:
        return token_capacity

    def _batches(
        self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int
    ) -> Iterator[list[int]]:
        batch: list[int] = []
        used = 0
        for position, length in items:
            if batch and (used + length > token_capacity or len(batch) == slots):
                yield batch
                batch, used = [], 0
            batch.append(position)
            used += length
        if batch:
            yield batch


@dataclass(frozen=True)
class _LookAhead(PackingPolicy):
    """A batch chooses among the ``B`` oldest unpacked pieces; the rest wait for the next one.

    Before each batch the buffer is topped up from the stream to ``B`` candidates; the batch
    takes the candidates its rule selects (:meth:`_choose`), and those it leaves stay, in stream
    order, for the next batch. Bound: ``M <= min(B, T, N)`` whatever the lengths. The first
    candidate a rule considers always fits an empty batch, so no batch is empty.
    """

    buffer_size: int

    def __post_init__(self) -> None:
        check_int("buffer_size", self.buffer_size, minimum=1)

    @property
    def label(self) -> str:
        return f"{self.name} B={self.buffer_size}"

    def _own_bound(self, token_capacity: int) -> int:
        return min(self.buffer_size, token_capacity)

    @staticmethod
    @abstractmethod
    def _choose(lengths: list[int], room: int, slots: int) -> list[int]:
        """Indices into ``lengths`` (the buffer) that the batch takes, at most ``slots`` of
        them, their lengths summing to at most ``room``."""

    def _batches(
        self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int
    ) -> Iterator[list[int]]:
        buffer: list[tuple[int, int]] = []
        while True:
            buffer.extend(islice(items, self.buffer_size - len(buffer)))
            if not buffer:
                return
            chosen = set(self._choose([length for _, length in buffer], token_capacity, slots))
            yield [position for index, (position, _) in enumerate(buffer) if index in chosen]
            buffer = [item for index, item in enumerate(buffer) if index not in chosen]


@dataclass(frozen=True)
class FirstFit(_LookAhead):
    """Look-ahead packing: take buffered candidates oldest first, each one that still fits.

    The oldest candidate always fits an empty batch, so every batch takes it: a piece that
    enters the buffer before batch ``b`` at buffer index ``i`` is packed by batch ``b + i``, at
    most ``B - 1`` batches later. Reordering is bounded by the buffer. Bound: ``M <= min(B, T)``.

    Args:
        buffer_size: ``B``, candidates each batch may choose from (>= 1). ``B = 1`` puts one
            piece in each batch (no packing at all).

    Raises:
        TypeError: ``buffer_size`` is not an int (``1.5``, ``"3"``, ``True``, ``None``).
        ValueError: ``buffer_size`` < 1.
    """

    name = "first-fit"

    @staticmethod
    def _choose(lengths: list[int], room: int, slots: int) -> list[int]:
        chosen = []
        for index, length in enumerate(lengths):
            if length <= room:
                chosen.append(index)
                room -= length
                if len(chosen) == slots or room == 0:
                    break
        return chosen


@dataclass(frozen=True)
class BestFit(_LookAhead):
    """Look-ahead packing: take the largest buffered candidate that fits, until none does.

    Scanning the candidates from longest to shortest (ties: oldest first) and taking each one
    that fits is the same as repeatedly taking the largest that fits, since the room only
    shrinks. Long pieces go first and short ones fill the gaps, so batches fill better than with
    first-fit and hold more pieces. Nothing bounds how long a short piece may wait while longer
    ones keep filling batches. Bound: ``M <= min(B, T)``.

    Args:
        buffer_size: ``B``, candidates each batch may choose from (>= 1).

    Raises:
        TypeError: ``buffer_size`` is not an int (``1.5``, ``"3"``, ``True``, ``None``).
        ValueError: ``buffer_size`` < 1.
    """

    name = "best-fit"

    @staticmethod
    def _choose(lengths: list[int], room: int, slots: int) -> list[int]:
        chosen = []
        # sorted() is stable, also with reverse=True: equal lengths stay oldest first.
        for index in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True):
            if lengths[index] <= room:
                chosen.append(index)
                room -= lengths[index]
                if len(chosen) == slots or room == 0:
                    break
        return chosen
