"""Packing policies: which pieces go into which batch of capacity ``T``.

A policy groups a stream of piece lengths (each ``1..T``) into batches of ``M >= 1`` pieces and
``L <= T`` tokens. :class:`FirstFit` and :class:`BestFit` choose among the ``B`` oldest unpacked
pieces (the seed article's candidate buffer), so ``M <= min(B, T)`` whatever the data: the bound
that sizes ``N``. Policies yield stream positions, and the batches still to come depend only on
the unpacked pieces followed by the rest of the stream: a loader that saves the unpacked pieces
and feeds them first resumes exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

__all__ = ["PackingPolicy", "InOrder", "FirstFit", "BestFit"]


def _checked(lengths: Iterable[int], token_capacity: int) -> Iterator[tuple[int, int]]:
    for position, length in enumerate(lengths):
        if not 0 < length <= token_capacity:
            raise ValueError(f"lengths[{position}] must be in 1..token_capacity={token_capacity}, got {length} "
                             "(cut long documents with segment() first)")
        yield position, int(length)


class PackingPolicy(ABC):
    """Groups a stream of piece lengths into batches of at most ``T`` tokens and ``N`` pieces."""

    name: str

    @property
    @abstractmethod
    def label(self) -> str:
        """E.g. ``"best-fit B=32"``."""

    @abstractmethod
    def _own_bound(self, token_capacity: int) -> int:
        """The bound on ``M`` without a sequence cap."""

    def sequence_bound(self, token_capacity: int, sequence_capacity: int | None = None) -> int:
        """The largest ``M`` any batch can have, for every input stream: ``min(policy bound, N)``."""
        bound = self._own_bound(token_capacity)
        return bound if sequence_capacity is None else min(bound, sequence_capacity)

    @abstractmethod
    def _batches(self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int) -> Iterator[list[int]]:
        ...

    def batches(self, lengths: Iterable[int], token_capacity: int,
                sequence_capacity: int | None = None) -> Iterator[list[int]]:
        """Each batch's stream positions, increasing, for a lazily read stream of piece lengths:
        every piece in one batch of ``1 <= M <= sequence_bound(T, N)`` pieces, ``L <= T`` tokens."""
        slots = self.sequence_bound(token_capacity, sequence_capacity)
        return self._batches(_checked(lengths, token_capacity), token_capacity, slots)


@dataclass(frozen=True)
class InOrder(PackingPolicy):
    """Append pieces in stream order; close the batch when the next one does not fit. Bound:
    ``M <= T`` (pieces of one token), so a graph needs ``N = T`` unless ``N`` caps ``M``."""

    name = "in-order"

    @property
    def label(self) -> str:
        return self.name

    def _own_bound(self, token_capacity: int) -> int:
        return token_capacity

    def _batches(self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int) -> Iterator[list[int]]:
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
    """A batch takes what :meth:`_choose` selects among the ``B`` oldest unpacked pieces; the
    rest wait, in stream order. Bound: ``M <= min(B, T, N)`` whatever the lengths."""

    buffer_size: int

    @property
    def label(self) -> str:
        return f"{self.name} B={self.buffer_size}"

    def _own_bound(self, token_capacity: int) -> int:
        return min(self.buffer_size, token_capacity)

    @staticmethod
    @abstractmethod
    def _choose(lengths: list[int], room: int, slots: int) -> list[int]:
        """Indices into the buffer's ``lengths``: at most ``slots``, summing to at most ``room``."""

    def _batches(self, items: Iterator[tuple[int, int]], token_capacity: int, slots: int) -> Iterator[list[int]]:
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
    """Look-ahead packing: take buffered candidates oldest first, each one that still fits. The
    oldest always fits an empty batch, so a piece waits at most ``B - 1`` batches in the buffer."""

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

    Scanning from longest to shortest (ties: oldest first) and taking each candidate that fits is
    the same as repeatedly taking the largest that fits, since the room only shrinks. Batches fill
    better than with first-fit; nothing bounds how long a short piece may wait. ``M <= min(B, T)``.

    Source: seed article, "Show me the data!" (candidate-buffer look-ahead packing).
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
