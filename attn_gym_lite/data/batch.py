"""The fixed-capacity batch every loader produces (``T`` token rows, ``N`` sequence slots, of
which ``L`` tokens in ``M`` sequences are active), and how sequences are laid into it."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..checks import check_cu_seqlens, check_cu_seqlens_values
from ..ragged import cu_seqlens_from_lengths, packed_to_padded, pad_cu_seqlens

__all__ = ["PackedBatch", "batch_from_pieces"]


@dataclass(frozen=True, slots=True, repr=False)
class PackedBatch:
    """One fixed-capacity packed batch: ``M`` sequences back to back in rows ``0..L-1``, padding
    (id 0, label 0, no loss) in rows ``L..T-1``.

    ``input_ids``, ``labels`` (int64 ``[T]``, ``labels[t] == input_ids[t + 1]`` where counted),
    ``loss_mask`` (bool ``[T]``: rows without a target are excluded here, not by a ``-100``
    label), ``cu_seqlens`` (int32 ``[N + 1]``, ``[0, ..., L, L, L]``), and the host ints a trainer
    sizes its work and keys its graphs by: ``active_tokens`` (``L``), ``active_sequences`` (``M``),
    ``max_seqlen``. What would give a silently wrong loss is refused where the values are on the
    CPU (a device read would sync): broken ``cu_seqlens`` values or ``L > T``, host ints that
    contradict ``cu_seqlens``, a counted row past ``L``, on a sequence's last token, with a
    negative label or with a label that is not the next token.

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
        check_cu_seqlens(self.cu_seqlens, device=self.input_ids.device, argument="PackedBatch.cu_seqlens")
        T, L = self.token_capacity, self.active_tokens
        if not (0 <= self.max_seqlen <= L <= T and 0 <= self.active_sequences <= self.sequence_capacity):
            raise ValueError(f"PackedBatch needs 0 <= max_seqlen <= active_tokens <= T = {T} and 0 <= active_sequences "
                             f"<= N = {self.sequence_capacity}, got L = {L}, M = {self.active_sequences}, "
                             f"max_seqlen = {self.max_seqlen}")
        if self.cu_seqlens.device.type == "cpu":
            bounds = check_cu_seqlens_values(self.cu_seqlens, token_capacity=T,
                                             argument="PackedBatch.cu_seqlens").numpy()
            lengths = np.diff(bounds)
            said = {"active_tokens": ("cu_seqlens[-1]", int(bounds[-1])),
                    "active_sequences": ("the non-empty sequences in cu_seqlens", int(np.count_nonzero(lengths))),
                    "max_seqlen": ("the longest sequence in cu_seqlens", int(lengths.max()))}
            for name, (what, value) in said.items():
                if getattr(self, name) != value:
                    raise ValueError(f"PackedBatch.{name} must equal {what} = {value} (got {getattr(self, name)})")
        if self.loss_mask.device.type == "cpu":
            self._check_counted_rows()

    def _check_counted_rows(self) -> None:
        rows = np.flatnonzero(self.loss_mask.numpy())
        if rows.size and rows[-1] >= self.active_tokens:
            raise ValueError(f"PackedBatch.loss_mask must be False on the padding rows L..T-1 (L = "
                             f"{self.active_tokens}), got True at row {rows[rows >= self.active_tokens][0]}")
        if self.labels.device.type != "cpu":
            return
        labels = self.labels.numpy()
        if (labels[rows] < 0).any():
            raise ValueError(f"PackedBatch.labels must be >= 0 on the rows loss_mask counts, got {labels[rows].min()}: "
                             "exclude a row with loss_mask, not with a -100 label")
        if self.input_ids.device.type == "cpu" and self.cu_seqlens.device.type == "cpu":
            # A sequence's last token has no target in its sequence: the next row starts another one.
            last = np.isin(rows + 1, self.cu_seqlens.numpy()[1:])
            wrong = last | (labels[rows] != self.input_ids.numpy()[np.minimum(rows + 1, self.token_capacity - 1)])
            if wrong.any():
                row = int(rows[wrong][0])
                reason = "is the last token of its sequence" if last[wrong][0] else "has a label != input_ids[t + 1]"
                raise ValueError(f"PackedBatch.loss_mask counts row {row}, which {reason} (a counted row must "
                                 "predict the next token of its own sequence)")

    def __repr__(self) -> str:
        tensors = ", ".join(f"{name}={_describe(getattr(self, name))}"
                            for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"))
        return (f"PackedBatch(T={self.token_capacity}, N={self.sequence_capacity}, L={self.active_tokens}, "
                f"M={self.active_sequences}, max_seqlen={self.max_seqlen}, {tensors})")

    @property
    def token_capacity(self) -> int:
        return self.input_ids.shape[0]

    @property
    def sequence_capacity(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def pin_memory(self) -> PackedBatch:
        """A copy in pinned host memory (for ``copy_(..., non_blocking=True)``); ``self`` without CUDA."""
        if not torch.cuda.is_available():
            return self
        return dataclasses.replace(self, **{name: getattr(self, name).pin_memory()
                                            for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")})


def _describe(tensor: Tensor) -> str:
    # dtype and shape only: the values of T rows would flood a log (and, on a device, sync).
    device = "" if tensor.device.type == "cpu" else f"@{tensor.device}"
    return f"{str(tensor.dtype).removeprefix('torch.')}[{', '.join(map(str, tensor.shape))}]{device}"


def assemble(active_ids: Tensor, lengths: Sequence[int], token_capacity: int, sequence_capacity: int, *,
             loss_on_second_half: bool = False) -> PackedBatch:
    """Lay ``M`` sequences (``lengths``) of ``active_ids`` into a batch; ``loss_on_second_half``
    counts only each sequence's second half (a prompt/response split)."""
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
        response_starts = active_cu_seqlens[:-1].long() + lengths_tensor.long() // 2
        per_token_start = torch.repeat_interleave(response_starts, lengths_tensor.long())
        loss_mask[:active_tokens] &= torch.arange(active_tokens) >= per_token_start
        labels[:active_tokens] *= loss_mask[:active_tokens]
    return PackedBatch(input_ids, labels, loss_mask, pad_cu_seqlens(active_cu_seqlens, sequence_capacity),
                       active_tokens, len(lengths), max(lengths))


def pack_pieces(pieces: Sequence[Sequence[int]], lengths: Sequence[int], token_capacity: int,
                sequence_capacity: int) -> PackedBatch:
    """:func:`batch_from_pieces` with the pieces' lengths already known (the loader's path)."""
    # np.fromiter reads the ids straight into int64 storage, several times faster than
    # torch.tensor(list) on the thousands of Python ints a batch holds.
    active_ids = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=sum(lengths))
    return assemble(torch.from_numpy(active_ids), lengths, token_capacity, sequence_capacity)


def batch_from_pieces(pieces: Sequence[Sequence[int]], token_capacity: int, sequence_capacity: int) -> PackedBatch:
    """``M <= N`` non-empty token-id sequences back to back in one batch of capacity ``T``, ``N``:
    one sequence per piece, next-token labels within it, no loss on its last token."""
    return pack_pieces(pieces, [len(piece) for piece in pieces], token_capacity, sequence_capacity)


def padded_batch(batch: PackedBatch) -> PackedBatch:
    """The same sequences padded to ``M`` rows of ``S_max`` (the baseline packing is measured
    against); for a causal model the loss is the packed batch's exactly."""
    rows, width = batch.active_sequences, batch.max_seqlen
    cu = batch.cu_seqlens[: rows + 1]
    fields = [packed_to_padded(getattr(batch, name)[: batch.active_tokens], cu, max_seqlen=width).reshape(-1)
              for name in ("input_ids", "labels", "loss_mask")]
    return PackedBatch(*fields, torch.arange(0, rows * width + 1, width, dtype=torch.int32), rows * width, rows, width)
