"""Sharding a corpus across data-parallel ranks (each packs its own documents), and the single
batch one process would train on instead (:func:`global_batch`, the data-parallel reference)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

import torch

from .batch import PackedBatch
from .corpora import python_stdlib_corpus
from .loader import PackedLoader

__all__ = ["ShardedPackedLoader", "global_batch", "shard_corpus"]


def shard_corpus(corpus: Callable[[], Iterable[object]] | Sequence[object], rank: int,
                 world_size: int) -> Callable[[], Iterable[object]]:
    """Documents ``rank, rank + W, ...`` of a corpus, re-readable. A rank with no document would
    never join its ranks' collectives, so a sequence must hold at least ``W``."""
    if callable(corpus):
        return lambda: itertools.islice(corpus(), rank, None, world_size)
    if not 0 <= rank < world_size <= len(corpus):
        raise ValueError(f"rank must be in [0, world_size) and world_size at most the {len(corpus)} documents "
                         f"of corpus (every rank needs one), got rank {rank}, world_size {world_size}")
    return lambda: iter(corpus[rank::world_size])


class ShardedPackedLoader(PackedLoader):
    """A :class:`~attn_gym_lite.data.PackedLoader` over this rank's shard; another rank's state is
    refused. Shards give different numbers of batches, so train a fixed number of steps with
    ``epochs=None`` (DDP needs every rank to take the same steps)."""

    def __init__(self, token_capacity: int, *args, rank: int, world_size: int,
                 corpus: Callable[[], Iterable[object]] | Sequence[object] | None = None, **kwargs) -> None:
        self.rank, self.world_size = rank, world_size
        corpus = shard_corpus(python_stdlib_corpus if corpus is None else corpus, rank, world_size)
        super().__init__(token_capacity, *args, corpus=corpus, **kwargs)

    def _config(self) -> dict:
        return {**super()._config(), "shard": [self.rank, self.world_size]}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "shard": {"rank": self.rank, "world_size": self.world_size}}


def global_batch(batches: Sequence[PackedBatch]) -> PackedBatch:
    """The ranks' CPU batches of one step back to back (``T = sum T_r``, ``N = sum N_r``): for a
    model whose rows interact only within a sequence, its mean loss is the global token mean a
    data-parallel step must reproduce."""
    capacity = sum(b.token_capacity for b in batches)
    slots = sum(b.sequence_capacity for b in batches)
    fields = {name: torch.cat([getattr(b, name)[: b.active_tokens] for b in batches])
              for name in ("input_ids", "labels", "loss_mask")}
    active = fields["input_ids"].shape[0]
    padding = capacity - active
    fields = {name: torch.cat([value, value.new_zeros(padding)]) for name, value in fields.items()}
    # Each rank's non-empty sequences' end rows, shifted by the rows before it. Not the first M_r
    # boundaries: an empty sequence may sit between two others ([0, 3, 3, 4]), and taking
    # cu_seqlens[1 : M + 1] there would drop the last sequence's end and merge it into the next
    # rank's first sequence.
    bounds, offset = [torch.zeros(1, dtype=torch.int32)], 0
    for b in batches:
        ends = b.cu_seqlens[1:]
        bounds.append(ends[ends > b.cu_seqlens[:-1]] + offset)
        offset += b.active_tokens
    cu_seqlens = torch.cat(bounds)
    cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_full((slots + 1 - cu_seqlens.shape[0],), active)])
    return PackedBatch(**fields, cu_seqlens=cu_seqlens, active_tokens=active,
                       active_sequences=sum(b.active_sequences for b in batches),
                       max_seqlen=max(b.max_seqlen for b in batches))
