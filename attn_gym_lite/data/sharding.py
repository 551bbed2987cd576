"""Sharding a corpus across data-parallel ranks: each rank packs its own documents.

A data layer piece (no torch.distributed here): :func:`shard_corpus` gives rank ``r`` of ``W`` the
documents ``r, r + W, ...`` as a re-readable corpus, and :class:`ShardedPackedLoader` is a
:class:`~attn_gym_lite.data.PackedLoader` over that shard whose saved state names its shard;
:func:`global_batch` packs the ranks' batches of one step into the single batch one process would
train on instead (the reference a data-parallel step must reproduce). The distributed training
step that uses them is :mod:`attn_gym_lite.graph.distributed`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from ..checks import check_int
from .batch import PackedBatch
from .corpora import python_stdlib_corpus
from .loader import PackedLoader
from .tokenizer import check_document, corpus_function

__all__ = ["ShardedPackedLoader", "global_batch", "shard_corpus"]


def shard_corpus(corpus: Callable[[], Iterable[object]] | Sequence[object], rank: int,
                 world_size: int) -> Callable[[], Iterable[object]]:
    """Rank ``rank``'s shard of a corpus: documents ``rank, rank + W, rank + 2W, ...``.

    A round-robin split by document, so the shards are disjoint, cover the corpus and differ in
    size by at most one document (their token counts differ more: documents vary in length).

    Args:
        corpus: a sequence of documents or a zero-argument function returning an iterable of them
            (as :class:`~attn_gym_lite.data.PackedLoader` takes; a document is a string or a list of
            token ids).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: ``W``, number of shards (>= 1).

    Returns:
        A zero-argument function returning the shard's documents in corpus order; re-readable
        (each call starts over), as a resumable loader needs. A sequence is read by slicing, a
        function by skipping (every rank reads the whole stream and keeps its documents).

    Raises:
        TypeError: ``corpus`` is neither; ``rank`` or ``world_size`` not an int; a document that
            is not a string or a list/tuple of token ids (the loader's rule,
            :func:`~attn_gym_lite.data.tokenizer.check_document`, applied with the document's
            index in the whole corpus: checked here for a sequence, as the shard is read for a
            function, whose result must also be iterable).
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``; a sequence with
            fewer documents than ``world_size`` (a rank would get none, and data-parallel ranks
            must all take the same steps).
    """
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0, maximum=world_size - 1)
    if callable(corpus):
        documents = corpus_function(corpus)
        return lambda: _checked_documents(documents(), rank, world_size)
    if isinstance(corpus, Sequence) and not isinstance(corpus, (str, bytes)):
        if len(corpus) == 0:
            raise ValueError("corpus must hold at least one document, got an empty sequence (no batch could be made)")
        if len(corpus) < world_size:
            raise ValueError(
                f"world_size must be at most the number of documents in corpus ({len(corpus)}), so that every rank "
                f"gets one, got {world_size}"
            )
        for index, document in enumerate(corpus):
            check_document(index, document)
        return lambda: iter(corpus[rank::world_size])
    raise TypeError(
        "corpus must be a sequence of documents or a zero-argument function returning an iterable of them, "
        f"got {type(corpus).__name__}"
    )


def _checked_documents(documents: Iterable[object], rank: int, world_size: int) -> Iterator[object]:
    for index, document in enumerate(itertools.islice(documents, rank, None, world_size)):
        check_document(rank + index * world_size, document)
        yield document


class ShardedPackedLoader(PackedLoader):
    """A :class:`~attn_gym_lite.data.PackedLoader` over rank ``rank``'s shard of the corpus.

    The same pipeline and arguments as ``PackedLoader`` (``token_capacity``, ``corpus``, ``policy``,
    ``seed``, ...), on :func:`shard_corpus` ``(corpus, rank, world_size)``: every rank packs batches of
    the same capacity ``(T, N)`` from different documents. The same ``seed`` on every rank is fine
    (the shards differ).

    Resuming: each rank saves and restores its own :meth:`state_dict`; the state records
    ``rank`` and ``world_size`` (key ``"shard"``), and :meth:`load_state_dict` refuses another
    rank's state or another world size (a rank's document indices count within its shard).

    The ranks' shards give different numbers of batches. DDP needs every rank to take the same
    number of steps (each step is a collective): train for a fixed number of steps with
    ``epochs=None`` (repeat forever), or stop all ranks at the first that runs out.

    Args:
        token_capacity, *args, **kwargs: as for ``PackedLoader``; ``corpus`` as for
            :func:`shard_corpus` (default: the stdlib corpus).
        rank, world_size: this rank and ``W`` (keyword-only).

    Raises:
        TypeError, ValueError: as ``PackedLoader`` and :func:`shard_corpus`.
    """

    def __init__(self, token_capacity: int, *args, rank: int, world_size: int,
                 corpus: Callable[[], Iterable[object]] | Sequence[object] | None = None, **kwargs) -> None:
        if corpus is None:
            corpus = python_stdlib_corpus
        self.rank = check_int("rank", rank, minimum=0)
        self.world_size = check_int("world_size", world_size, minimum=1)
        super().__init__(token_capacity, *args, corpus=shard_corpus(corpus, rank, world_size), **kwargs)

    def state_dict(self) -> dict:
        """``PackedLoader.state_dict()`` plus ``"shard": {"rank", "world_size"}``."""
        return {**super().state_dict(), "shard": {"rank": self.rank, "world_size": self.world_size}}

    def load_state_dict(self, state: dict) -> None:
        """Continue from this rank's :meth:`state_dict`.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: ``state`` has no ``"shard"`` entry or was saved by another rank or world
                size; or whatever ``PackedLoader.load_state_dict`` refuses.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        expected = {"rank": self.rank, "world_size": self.world_size}
        shard = state.get("shard")
        # Compared with the types too: {"rank": False} equals {"rank": 0} under ==.
        if not (isinstance(shard, dict) and all(type(shard.get(key)) is int for key in expected) and shard == expected):
            raise ValueError(f"state must be saved by the shard {expected}, got shard {state.get('shard')!r}")
        super().load_state_dict({key: value for key, value in state.items() if key != "shard"})


def global_batch(batches: Sequence[PackedBatch]) -> PackedBatch:
    """The ranks' batches of one step as one packed batch: what a single process would train on.

    The active rows of ``batches[0]``, then those of ``batches[1]``, ... back to back (each rank's
    padding rows dropped), padded to the sum of their capacities. Sequences, labels and loss masks
    are kept as they were, so for a model whose rows interact only within a sequence (packed
    attention, positions restarting at every document) the logits of every active row are those
    the rank computed, and the mean loss over the global batch's loss-masked rows is the global
    token mean a data-parallel step must reproduce.

    Args:
        batches: one :class:`~attn_gym_lite.data.PackedBatch` per rank (at least one), on the CPU.

    Returns:
        A ``PackedBatch`` with ``T = sum T_r``, ``N = sum N_r``, ``L = sum L_r``,
        ``M = sum M_r`` and ``S_max = max S_max_r``.

    Raises:
        TypeError: ``batches`` is not a non-string sequence of ``PackedBatch`` es.
        ValueError: ``batches`` is empty; a batch is not on the CPU. (A batch on the CPU has host
            ints that agree with its ``cu_seqlens``: :class:`~attn_gym_lite.data.PackedBatch`
            checked them when it was built.)
    """
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Sequence):
        raise TypeError(f"batches must be a sequence of PackedBatch, got {type(batches).__name__}")
    if not batches:
        raise ValueError("batches must hold at least one PackedBatch, got an empty sequence")
    for index, batch in enumerate(batches):
        if not isinstance(batch, PackedBatch):
            raise TypeError(f"batches[{index}] must be a PackedBatch, got {type(batch).__name__}")
        devices = {str(getattr(batch, name).device) for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
        if devices != {"cpu"}:
            raise ValueError(f"batches[{index}] must be on the CPU (as loaders make them), got tensors on {sorted(devices)}")
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
