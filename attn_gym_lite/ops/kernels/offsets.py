"""The per-call metadata of the flat, persistent and dynamic schedules, in one launch.

Before its kernels run, every call needs ``chunk_offsets`` (the prefix sum of ``ceil(s_i / C)``
over the sequences, :func:`attn_gym_lite.schedule.chunk_offsets`) and, for the dynamic schedule,
task counters set to zero. Written with torch ops that is five small kernels (a diff, a
concatenation, an add, a division, a cumsum) plus a fill: each costs a few microseconds of host
time to launch, which in eager mode is more than the tiny kernels themselves. This one kernel does
all of it: one CTA walks ``cu_seqlens`` in blocks, with a running total carried between blocks.

Capture-safe like the torch version: it reads ``cu_seqlens`` on the device only, so a graph that
captured it recomputes the offsets (and re-zeroes the counters) on every replay.

Source: the seed article, "Scheduling without max_seqlen" (``chunk_offsets``); the counters are
FlashAttention-3's dynamic tile scheduler's.
"""

import triton
import triton.language as tl


@triton.jit
def chunk_offsets_kernel(cu_seqlens, offsets, counters, num_seqs, NUM_COUNTERS: tl.constexpr,
                         CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """``offsets[i] = sum_{j < i} ceil((cu_seqlens[j + 1] - cu_seqlens[j]) / CHUNK)`` for
    ``i = 0 .. num_seqs``, then ``counters[:NUM_COUNTERS] = 0``. Launch with grid ``(1,)``."""
    carry = tl.full((), 0, tl.int32)
    for start in range(0, num_seqs + 1, BLOCK):
        i = start + tl.arange(0, BLOCK)
        # Slot i's entry counts the chunks of sequences 0 .. i-1, so element i adds sequence i-1.
        has_sequence = (i >= 1) & (i <= num_seqs)
        end = tl.load(cu_seqlens + i, mask=has_sequence, other=0)
        begin = tl.load(cu_seqlens + i - 1, mask=has_sequence, other=0)
        chunks = tl.where(has_sequence, (end - begin + CHUNK - 1) // CHUNK, 0)
        tl.store(offsets + i, carry + tl.cumsum(chunks, 0), mask=i <= num_seqs)
        carry += tl.sum(chunks, 0)
    if NUM_COUNTERS > 0:
        slots = tl.arange(0, 4)
        tl.store(counters + slots, tl.zeros([4], tl.int32), mask=slots < NUM_COUNTERS)
