"""The per-call metadata of the flat, persistent and dynamic schedules, in one launch.

Before its kernels run, every call needs ``chunk_offsets`` (the prefix sum of ``ceil(s_i / C)``
over the sequences, :func:`attn_gym_lite.schedule.chunk_offsets`) and, for the dynamic schedule,
task counters set to zero. Written with torch ops that is five small kernels (a diff, a
concatenation, an add, a division, a cumsum) plus a fill: each costs a few microseconds of host
time to launch, which in eager mode is more than the tiny kernels themselves. This one kernel does
all of it: one CTA walks ``cu_seqlens`` in blocks, with a running total carried between blocks.

Capture-safe like the torch version: it reads ``cu_seqlens`` on the device only, so a graph that
captured it recomputes the offsets (and re-zeroes the counters) on every replay.

:func:`launch_chunk_offsets` is the one host-side launch of it: every op that needs
``chunk_offsets`` on the device (the attention kernels of :mod:`.varlen`, the KDA kernels of
:mod:`attn_gym_lite.ops.kda.chunked_triton`) calls it.

Source: the seed article, "Scheduling without max_seqlen" (``chunk_offsets``); the counters are
FlashAttention-3's dynamic tile scheduler's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["token_capacity", "max_total"])
def chunk_offsets_kernel(cu_seqlens, offsets, counters, num_seqs, token_capacity, max_total,
                         NUM_COUNTERS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """``offsets[i] = min(max_total, sum_{j < i} ceil(s_j / CHUNK))`` for ``i = 0 .. num_seqs``,
    then ``counters[:NUM_COUNTERS] = 0``. Launch with grid ``(1,)``.

    ``s_j`` is sequence ``j``'s length clamped into the tensors, as the kernels' task decoding
    (:func:`attn_gym_lite.ops.kernels.tasks.sequence_bounds`) clamps it: ``start = clamp(cu[j], 0,
    T)``, ``end = clamp(cu[j + 1], start, T)``, ``s_j = end - start``. Totals are summed in 64 bits
    and capped at ``max_total`` (``G_cap``), so the offsets never decrease and never overflow, and
    no chunk they number lies past its sequence's end, whatever ``cu_seqlens`` holds. On a valid
    ``cu_seqlens`` neither the clamps nor the cap change anything."""
    carry = tl.full((), 0, tl.int64)
    for start in range(0, num_seqs + 1, BLOCK):
        i = start + tl.arange(0, BLOCK)
        # Slot i's entry counts the chunks of sequences 0 .. i-1, so element i adds sequence i-1.
        has_sequence = (i >= 1) & (i <= num_seqs)
        begin = tl.load(cu_seqlens + i - 1, mask=has_sequence, other=0)
        begin = tl.minimum(tl.maximum(begin, 0), token_capacity)
        end = tl.load(cu_seqlens + i, mask=has_sequence, other=0)
        end = tl.minimum(tl.maximum(end, begin), token_capacity)
        chunks = tl.where(has_sequence, ((end - begin).to(tl.int64) + CHUNK - 1) // CHUNK, 0)
        totals = tl.minimum(carry + tl.cumsum(chunks, 0), max_total)
        tl.store(offsets + i, totals.to(tl.int32), mask=i <= num_seqs)
        carry = tl.minimum(carry + tl.sum(chunks, 0), max_total)
    if NUM_COUNTERS > 0:
        slots = tl.arange(0, 4)
        tl.store(counters + slots, tl.zeros([4], tl.int32), mask=slots < NUM_COUNTERS)


_INT32_MAX = 2**31 - 1


def launch_chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int, *, out: torch.Tensor | None = None,
                         counters: torch.Tensor | None = None, token_capacity: int | None = None) -> torch.Tensor:
    """``chunk_offsets`` of ``cu_seqlens`` for chunks of ``chunk_size`` tokens, on the device, in one
    launch that also zeroes up to 4 ``counters`` (the dynamic schedule's). With ``token_capacity``
    every sequence is clamped into ``[0, T]`` and the totals capped at ``G_cap``, exactly as the
    kernels decode their tasks, so a malformed ``cu_seqlens`` cannot send a kernel outside the
    tensors; on a valid one the values are :func:`attn_gym_lite.schedule.chunk_offsets`'."""
    N = cu_seqlens.numel() - 1
    if out is None:
        out = torch.empty(N + 1, dtype=torch.int32, device=cu_seqlens.device)
    if token_capacity is None:
        token_capacity, max_total = _INT32_MAX, _INT32_MAX
    else:
        largest = min(token_capacity, N)
        max_total = largest + (token_capacity - largest) // chunk_size  # G_cap
    block = max(16, min(1024, 1 << N.bit_length()))  # one CTA walks cu_seqlens in blocks, carrying the total
    chunk_offsets_kernel[(1,)](cu_seqlens, out, out if counters is None else counters, N, token_capacity, max_total,
                               NUM_COUNTERS=0 if counters is None else counters.numel(), CHUNK=chunk_size, BLOCK=block)
    return out
