"""The fixed-capacity batch every loader produces, and how sequences are laid into it.

A CUDA graph replays fixed shapes, so every batch handed to it has the same *capacity*: ``T``
token rows and ``N + 1`` ``cu_seqlens`` slots. What varies from step to step is how much of that
capacity is *active*: ``L = cu_seqlens[-1]`` tokens in ``M`` non-empty sequences.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..checks import check_capacities, check_cu_seqlens, check_cu_seqlens_values, check_int, check_int_sequence
from ..ragged import cu_seqlens_from_lengths, packed_to_padded, pad_cu_seqlens

__all__ = ["PackedBatch", "batch_from_pieces"]


@dataclass(frozen=True, slots=True, repr=False)  # __repr__ below: compact
class PackedBatch:
    """One fixed-capacity packed batch on the CPU: ``T`` token rows, ``N`` sequence slots.

    The first ``L`` rows hold ``M`` sequences back to back; rows ``L..T-1`` are padding
    (input id 0, label 0, loss mask False). Only the active sizes change between batches, so a
    CUDA graph captured on one batch's shapes can replay every batch after a ``copy_`` into its
    static buffers.

    Attributes:
        input_ids: int64 ``[T]`` token ids.
        labels: int64 ``[T]`` next-token targets within the same sequence:
            ``labels[t] == input_ids[t + 1]`` wherever ``loss_mask[t]`` is True. Where there is
            no target (a sequence's last token, padding) the label is 0: such rows are excluded
            by ``loss_mask``, not by a ``-100`` label (there is no ``ignore_index``), so a label
            the loss counts must be ``>= 0``.
        loss_mask: bool ``[T]``, True where ``labels`` is a real target that the loss counts.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L, L]``; the unused tail repeats
            ``L`` so that trailing slots describe empty sequences.
        active_tokens: ``L = cu_seqlens[-1]`` (tokens), ``0 <= L <= T``.
        active_sequences: ``M``, the number of non-empty sequences, ``0 <= M <= N``.
        max_seqlen: ``S_max``, the longest active sequence (tokens).

    The host ints must say what ``cu_seqlens`` says: a trainer sizes its work and keys its graphs
    by them. Where ``cu_seqlens`` is on the CPU (where loaders make batches) its values are read
    and checked: the value rules of :func:`attn_gym_lite.checks.check_cu_seqlens_values` with
    ``token_capacity = T``, then ``active_tokens == cu_seqlens[-1]``, ``active_sequences`` equal
    to the number of non-empty sequences and ``max_seqlen`` equal to the longest one. A batch
    whose ``cu_seqlens`` is on another device (CUDA) is checked by metadata only (its layout and
    the ranges of the host ints): reading its values would synchronise with the device, and is
    impossible during a CUDA graph capture. Likewise ``loss_mask`` is read where it is on the CPU:
    it must be False on every padding row ``L..T-1`` (``L = active_tokens``); and ``labels`` where
    it and ``loss_mask`` are on the CPU: no label on a row ``loss_mask`` counts may be negative,
    and (all four tensors on the CPU) each counted row ``t`` is not its sequence's last token and
    has ``labels[t] == input_ids[t + 1]``.
    (The vocabulary, and so the labels' upper bound, is the model's: the loss checks it.) The
    host ints are compared with ``cu_seqlens`` before ``max_seqlen <= active_tokens`` is checked,
    so the message names the field that disagrees with ``cu_seqlens``.

    Raises:
        TypeError: a field has the wrong type or dtype.
        ValueError: a field has the wrong shape or an out-of-range size; ``labels``,
            ``loss_mask`` or ``cu_seqlens`` not on ``input_ids``' device; more sequence slots than
            tokens (``N > T``, with ``T >= 1``); for CPU ``input_ids``, a negative id on any row;
            ``cu_seqlens`` not contiguous (the layout rules of
            :func:`attn_gym_lite.checks.check_cu_seqlens`); for a CPU ``cu_seqlens``, a value rule
            broken (``cu_seqlens[0] != 0``, a decrease, ``L > T``) or an ``active_tokens``,
            ``active_sequences`` or ``max_seqlen`` that is not what ``cu_seqlens`` says; for a CPU
            ``loss_mask``, True on a padding row (the message names the first); for CPU
            ``labels`` and ``loss_mask``, a negative label (``-100``, say) on a row ``loss_mask``
            counts; with ``input_ids`` and ``cu_seqlens`` on the CPU too, ``loss_mask`` True on a
            sequence's last token, or a counted label that is not ``input_ids[t + 1]``.

    Source: seed article, "A More Realistic Training Loop" (``PackedBatch``).
    """

    input_ids: Tensor
    labels: Tensor
    loss_mask: Tensor
    cu_seqlens: Tensor
    active_tokens: int
    active_sequences: int
    max_seqlen: int

    def __post_init__(self) -> None:
        # Shapes and dtypes first. Values are read only from a CPU cu_seqlens (at the end): reading
        # a device tensor's would sync if a caller built a batch from device tensors.
        expected = {
            "input_ids": torch.int64,
            "labels": torch.int64,
            "loss_mask": torch.bool,
        }
        # cu_seqlens by the layout rules every consumer shares, on input_ids' device.
        device = self.input_ids.device if isinstance(self.input_ids, Tensor) else None
        check_cu_seqlens(self.cu_seqlens, device=device, argument="PackedBatch.cu_seqlens")
        for name, dtype in expected.items():
            tensor = getattr(self, name)
            if not isinstance(tensor, Tensor):
                raise TypeError(f"PackedBatch.{name} must be a torch.Tensor, got {type(tensor)}")
            if tensor.dtype != dtype or tensor.dim() != 1:
                raise TypeError(
                    f"PackedBatch.{name} must be a 1-D {dtype} tensor, "
                    f"got {tensor.dtype} of shape {tuple(tensor.shape)}"
                )
        token_capacity = self.input_ids.shape[0]
        for name in ("labels", "loss_mask"):
            if getattr(self, name).shape[0] != token_capacity:
                raise ValueError(
                    f"PackedBatch.{name} must have T={token_capacity} rows like input_ids, "
                    f"got {getattr(self, name).shape[0]}"
                )
            # One device for the four tensors (cu_seqlens is checked above): a trainer copies them
            # into static buffers together, and a meta or other-device field failed only there.
            if getattr(self, name).device != self.input_ids.device:
                raise ValueError(
                    f"PackedBatch.{name} must be on input_ids' device {self.input_ids.device}, "
                    f"got {getattr(self, name).device}"
                )
        # N <= T, as check_capacities asks of every capacity pair (more slots than tokens is a
        # layout no loader makes and no graph is captured for).
        if self.sequence_capacity > max(token_capacity, 1):
            raise ValueError(
                f"PackedBatch.cu_seqlens must describe at most T={token_capacity} sequences (N <= T), "
                f"got N={self.sequence_capacity}"
            )
        check_int(
            "PackedBatch.active_tokens", self.active_tokens, minimum=0, maximum=token_capacity
        )
        check_int(
            "PackedBatch.active_sequences",
            self.active_sequences,
            minimum=0,
            maximum=self.sequence_capacity,
        )
        if type(self.max_seqlen) is not int:  # its type first (a float, say), with its range
            check_int("PackedBatch.max_seqlen", self.max_seqlen, minimum=0, maximum=self.active_tokens)
        # What cu_seqlens says comes before the bounds one host int puts on another (max_seqlen <=
        # active_tokens): a wrong active_tokens must be named as such, not as a max_seqlen too long.
        if self.cu_seqlens.device.type == "cpu":
            self._check_against_cu_seqlens()
        check_int("PackedBatch.max_seqlen", self.max_seqlen, minimum=0, maximum=self.active_tokens)
        if self.input_ids.device.type == "cpu":
            self._check_ids_not_negative()
        if self.loss_mask.device.type == "cpu":
            self._check_padding_not_counted()
        if self.labels.device.type == "cpu" and self.loss_mask.device.type == "cpu":
            self._check_counted_labels()
            if self.input_ids.device.type == "cpu" and self.cu_seqlens.device.type == "cpu":
                self._check_next_token_targets()

    def _check_ids_not_negative(self) -> None:
        """No negative token id on any row, padding included: the embedding reads all ``T`` rows
        (CPU values; on CUDA a negative id is a device-side assert in the first step)."""
        rows = np.flatnonzero(self.input_ids.numpy() < 0)
        if rows.size:
            row = int(rows[0])
            raise ValueError(
                f"PackedBatch.input_ids must be token ids >= 0 on every row (padding included: the model "
                f"embeds all T rows), got input_ids[{row}] = {int(self.input_ids[row])} ({rows.size} such rows)"
            )

    def _check_padding_not_counted(self) -> None:
        """``loss_mask`` False on the padding rows ``L..T-1`` (CPU values; see the class docstring)."""
        rows = np.flatnonzero(self.loss_mask.numpy()[self.active_tokens:])
        if rows.size:
            row = self.active_tokens + int(rows[0])
            raise ValueError(
                f"PackedBatch.loss_mask must be False on the padding rows L..T-1 = {self.active_tokens}.."
                f"{self.token_capacity - 1} (the loss would count padding), got loss_mask[{row}] = True "
                f"({rows.size} such rows)"
            )

    def _check_counted_labels(self) -> None:
        """No negative label on a row the loss counts (CPU values; see the class docstring)."""
        rows = np.flatnonzero((self.labels.numpy() < 0) & self.loss_mask.numpy())
        if rows.size:
            row = int(rows[0])
            raise ValueError(
                f"PackedBatch.labels must be >= 0 on the rows loss_mask counts, got labels[{row}] = "
                f"{int(self.labels[row])} where loss_mask[{row}] is True ({rows.size} such rows); rows without "
                "a target are excluded by loss_mask (set it False there), not by a -100 label"
            )

    def _check_next_token_targets(self) -> None:
        """Every counted row predicts the next token of its own sequence (CPU values; see the class
        docstring): never a sequence's last token (its label would be the next document's first
        token), and ``labels[t] == input_ids[t + 1]``."""
        rows = np.flatnonzero(self.loss_mask.numpy()[: self.active_tokens])
        if not rows.size:
            return
        bounds = self.cu_seqlens.numpy()
        last = np.flatnonzero(np.isin(rows + 1, bounds[1:]))
        if last.size:
            row = int(rows[last[0]])
            raise ValueError(
                f"PackedBatch.loss_mask must be False on each sequence's last token (it has no next token "
                f"in its sequence: its label would be the next document's first token), got loss_mask[{row}] "
                f"= True on the last token of the sequence ending at row {row + 1} ({last.size} such rows)")
        ids, labels = self.input_ids.numpy(), self.labels.numpy()
        wrong = np.flatnonzero(labels[rows] != ids[rows + 1])
        if wrong.size:
            row = int(rows[wrong[0]])
            raise ValueError(
                f"PackedBatch.labels must be the next token, labels[t] == input_ids[t + 1], on the rows "
                f"loss_mask counts, got labels[{row}] = {int(labels[row])} and input_ids[{row + 1}] = "
                f"{int(ids[row + 1])} ({wrong.size} such rows; labels = input_ids unshifted, say)")

    def _check_against_cu_seqlens(self) -> None:
        """The host ints against the values of a CPU ``cu_seqlens`` (see the class docstring)."""
        check_cu_seqlens_values(self.cu_seqlens, token_capacity=self.token_capacity,
                                argument="PackedBatch.cu_seqlens")
        # numpy on the (CPU) values: a few microseconds, against tens for the same torch ops.
        bounds = self.cu_seqlens.numpy()
        lengths = np.diff(bounds)
        active_tokens = int(bounds[-1])
        if self.active_tokens != active_tokens:
            raise ValueError(
                f"PackedBatch.active_tokens must equal cu_seqlens[-1] = {active_tokens} (L, the active tokens), "
                f"got {self.active_tokens}"
            )
        active_sequences = int(np.count_nonzero(lengths))  # lengths >= 0: the value rules hold
        if self.active_sequences != active_sequences:
            raise ValueError(
                f"PackedBatch.active_sequences must equal the number of non-empty sequences in cu_seqlens "
                f"(M = {active_sequences}), got {self.active_sequences}"
            )
        longest = int(lengths.argmax())
        if self.max_seqlen != int(lengths[longest]):
            raise ValueError(
                f"PackedBatch.max_seqlen must equal the longest sequence in cu_seqlens "
                f"(sequence {longest}, {int(lengths[longest])} tokens), got {self.max_seqlen}"
            )

    def __repr__(self) -> str:
        """``PackedBatch(T=512, N=8, L=431, M=5, max_seqlen=97, input_ids=int64[512], ...)``.

        Compact: the capacities and the host ints, then each tensor field as dtype and shape (with
        its device where that is not the CPU); no tensor values, which at ``T`` in the thousands
        would print tens of thousands of characters (and, on a device, read it).
        """
        tensors = ", ".join(f"{name}={_describe(getattr(self, name))}"
                            for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"))
        return (f"PackedBatch(T={self.token_capacity}, N={self.sequence_capacity}, L={self.active_tokens}, "
                f"M={self.active_sequences}, max_seqlen={self.max_seqlen}, {tensors})")

    @property
    def token_capacity(self) -> int:
        """``T``: rows of ``input_ids``/``labels``/``loss_mask``."""
        return self.input_ids.shape[0]

    @property
    def sequence_capacity(self) -> int:
        """``N``: sequence slots, ``cu_seqlens`` has ``N + 1`` entries."""
        return self.cu_seqlens.shape[0] - 1

    def pin_memory(self) -> PackedBatch:
        """Return a copy whose tensors live in pinned (page-locked) host memory.

        Pinned memory lets ``static.copy_(batch.x, non_blocking=True)`` run asynchronously.
        Pinning needs a CUDA driver (some CPU-only torch builds raise), so without CUDA this
        returns ``self`` unchanged: the same training code then runs in CPU mode.
        """
        if not torch.cuda.is_available():
            return self
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.pin_memory(),
            labels=self.labels.pin_memory(),
            loss_mask=self.loss_mask.pin_memory(),
            cu_seqlens=self.cu_seqlens.pin_memory(),
        )


INT64_MAX = torch.iinfo(torch.int64).max


def _describe(tensor: Tensor) -> str:
    """``int64[512]``, with ``@cuda:0`` where the tensor is not on the CPU (metadata only)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    device = "" if tensor.device.type == "cpu" else f"@{tensor.device}"
    return f"{dtype}[{', '.join(map(str, tensor.shape))}]{device}"


def assemble(
    active_ids: Tensor,
    lengths: Sequence[int],
    token_capacity: int,
    sequence_capacity: int,
    *,
    loss_on_second_half: bool = False,
) -> PackedBatch:
    """Lay ``M`` sequences (``lengths``, each >= 1, summing to ``L``) into a capacity-T batch.

    ``active_ids`` is int64 ``[L]``, the sequences back to back. With ``loss_on_second_half`` only
    tokens in the second half of each sequence count (a prompt/response split).
    """
    active_tokens = active_ids.shape[0]
    lengths_tensor = torch.tensor(lengths, dtype=torch.int32)
    active_cu_seqlens = cu_seqlens_from_lengths(lengths_tensor)

    input_ids = torch.zeros(token_capacity, dtype=torch.int64)
    labels = torch.zeros(token_capacity, dtype=torch.int64)
    loss_mask = torch.zeros(token_capacity, dtype=torch.bool)
    input_ids[:active_tokens] = active_ids
    # Shift by one over the whole active region, then cut at sequence ends: the target of a
    # sequence's last token would be the next sequence's first token, which it must not predict.
    labels[: active_tokens - 1] = active_ids[1:]
    loss_mask[: active_tokens - 1] = True
    last_tokens = active_cu_seqlens[1:].long() - 1
    labels[last_tokens] = 0
    loss_mask[last_tokens] = False
    if loss_on_second_half:
        starts = active_cu_seqlens[:-1].long()
        response_starts = starts + lengths_tensor.long() // 2
        positions = torch.arange(active_tokens)
        per_token_start = torch.repeat_interleave(response_starts, lengths_tensor.long())
        loss_mask[:active_tokens] &= positions >= per_token_start
        labels[:active_tokens] *= loss_mask[:active_tokens]

    return PackedBatch(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        cu_seqlens=pad_cu_seqlens(active_cu_seqlens, sequence_capacity),
        active_tokens=active_tokens,
        active_sequences=len(lengths),
        max_seqlen=max(lengths),
    )



def batch_from_pieces(
    pieces: Sequence[Sequence[int]], token_capacity: int, sequence_capacity: int
) -> PackedBatch:
    """Lay token-id sequences back to back into one batch of capacity ``T``, ``N``.

    Each piece becomes one sequence, in the given order: ``cu_seqlens`` boundaries are the piece
    boundaries, labels are next tokens within a piece, and the loss mask is False on each piece's
    last token and on the padding rows ``L..T-1``.

    Args:
        pieces: ``M`` non-empty sequences of token ids (ints >= 0; a 1-D integer tensor or array
            is one too), ``1 <= M <= N``, whose lengths sum to ``L <= T``.
        token_capacity: ``T`` (tokens), >= 1.
        sequence_capacity: ``N``, ``1 <= N <= T``.

    Returns:
        A :class:`PackedBatch` on the CPU (not pinned).

    Raises:
        TypeError: a capacity is not an int; ``pieces`` is not a sequence of sequences; an id
            that is not an int (``1.5``, ``True``; a float tensor), named ``pieces[i][j]``.
        ValueError: no pieces, more than ``N`` pieces, an empty piece, ``L > T``, or a negative id
            or one past int64 (named ``pieces[i][j]``).
    """
    token_capacity, sequence_capacity = check_capacities(token_capacity, sequence_capacity)
    if isinstance(pieces, (str, bytes, Tensor)) or not isinstance(pieces, Sequence):
        raise TypeError(f"pieces must be a sequence of token-id sequences, got {type(pieces).__name__}")
    for index, piece in enumerate(pieces):
        # A sequence, or a 1-D tensor or array (a 0-d one has tolist but no length); bytearray is
        # bytes too.
        if isinstance(piece, (str, bytes, bytearray)) or not (isinstance(piece, Sequence) or getattr(piece, "ndim", None) == 1):
            raise TypeError(
                f"pieces[{index}] must be a sequence of token ids (ints), got {type(piece).__name__}: {piece!r:.40}"
            )
    lengths = [len(piece) for piece in pieces]
    if not 1 <= len(lengths) <= sequence_capacity:
        raise ValueError(
            f"pieces must hold 1..sequence_capacity={sequence_capacity} sequences, "
            f"got {len(lengths)}"
        )
    if min(lengths) == 0:
        raise ValueError(f"pieces must be non-empty, got lengths {lengths}")
    if sum(lengths) > token_capacity:
        raise ValueError(
            f"pieces must hold at most token_capacity={token_capacity} tokens, "
            f"got {sum(lengths)} (lengths {lengths})"
        )
    # Every id, before any work: np.fromiter below would truncate 1.5 to 1 and keep -1.
    ids = [check_int_sequence(f"pieces[{index}]", piece, minimum=0, maximum=INT64_MAX) for index, piece in enumerate(pieces)]
    return pack_pieces(ids, lengths, token_capacity, sequence_capacity)


def pack_pieces(pieces: Sequence[Sequence[int]], lengths: Sequence[int], token_capacity: int,
                sequence_capacity: int) -> PackedBatch:
    """:func:`batch_from_pieces` without its checks, for callers whose pieces are already valid:
    the loader (a tokenizer's ids, or pre-tokenized documents checked by
    :func:`~attn_gym_lite.data.tokenizer.check_token_ids`) and the packing benchmark, which
    measures the loader's path. ``lengths`` are the pieces' lengths (``1 <= M <= N``, sum ``<= T``).

    Raises:
        Nothing of its own: what is checked is the caller's to check.
    """
    # np.fromiter reads the ids straight into int64 storage, several times faster than
    # torch.tensor(list) on the thousands of Python ints a batch holds.
    active_ids = np.fromiter(
        itertools.chain.from_iterable(pieces), dtype=np.int64, count=sum(lengths)
    )
    return assemble(torch.from_numpy(active_ids), lengths, token_capacity, sequence_capacity)


def padded_batch(batch: PackedBatch) -> PackedBatch:
    """The same sequences in the padded layout: each right-padded to ``S_max`` tokens, ``M`` rows.

    Expressed as a packed batch of ``M`` sequences of ``S_max`` tokens each (``T' = M * S_max``,
    ``cu_seqlens = [0, S_max, 2 S_max, ...]``): padding positions have id 0, label 0 and no loss,
    so the loss is the packed batch's exactly, for a causal model (a token never sees the padding
    after it). This is the layout packing replaces, kept as the baseline it is measured against
    (attention ``impl="sdpa"``).

    Raises:
        ValueError: the batch has no active sequence.
    """
    rows, width = batch.active_sequences, batch.max_seqlen
    if rows < 1 or width < 1:
        raise ValueError(f"batch must hold at least one token, got M = {rows}, S_max = {width}")
    cu = batch.cu_seqlens[: rows + 1]
    fields = {
        name: packed_to_padded(getattr(batch, name)[: batch.active_tokens], cu, max_seqlen=width).reshape(-1)
        for name in ("input_ids", "labels", "loss_mask")
    }
    return PackedBatch(
        **fields,
        cu_seqlens=torch.arange(0, rows * width + 1, width, dtype=torch.int32),
        active_tokens=rows * width,
        active_sequences=rows,
        max_seqlen=width,
    )

