"""Which chunk a program works on: the three schedules, as two small device functions.

Every ragged kernel in this package is written as

    for i in range(task_count(...)):
        seq_start, seq_len, chunk, head = task_at(i, ...)
        <process chunk ``chunk`` of the sequence at ``seq_start`` for head ``head``>

and the schedule (a compile-time constant) decides only what those two functions return:

* ``"rect"``, grid ``(ceil(max_seqlen / C), N, H)``: program ``(chunk, seq, head)`` owns exactly
  that slot, and runs 1 task if the slot lies inside the sequence, 0 if it lies past its end
  (FlashAttention-2's early exit).
* ``"flat"``, grid ``(chunk_capacity(T, N, C), H)``: program ``(flat, head)`` runs 1 task if
  ``flat < chunk_offsets[N]`` (the active chunk count, read on the device), else 0; its sequence
  is found by binary search over ``chunk_offsets``.
* ``"persistent"``, grid ``(workers,)``: worker ``w`` runs tasks ``w, w + workers, ...`` below
  ``chunk_offsets[N] * H``; task ``t`` is chunk ``t % active`` of head ``t // active``, so
  workers running side by side share a head and neighbouring chunks (and their keys in L2).

No schedule reads anything on the host: the active work comes from ``cu_seqlens`` and
``chunk_offsets`` in device memory, so a captured graph adapts to each replay's batch.

Source: the seed article, sections "The anatomy of a ragged kernel" (rect), "Scheduling without
max_seqlen" (flat, the decoding) and "Graph overcapture" (persistent).
"""

import triton
import triton.language as tl


@triton.jit
def find_sequence(chunk_offsets, flat_chunk, num_seqs):
    """The sequence owning ``flat_chunk``: the last ``i`` with ``chunk_offsets[i] <= flat_chunk``.

    Keeps ``chunk_offsets[lo] <= flat_chunk < chunk_offsets[hi]`` while halving ``[lo, hi)``;
    it starts from ``[0, N)``, valid because ``chunk_offsets[0] = 0`` and ``chunk_offsets[N] =
    G_active > flat_chunk``. Empty slots share their offset with the next slot, so they can be
    ``lo`` only transiently: the last slot with that offset is the one that owns chunks.
    """
    lo = 0
    hi = num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        owns_mid_or_later = tl.load(chunk_offsets + mid) <= flat_chunk
        lo = tl.where(owns_mid_or_later, mid, lo)
        hi = tl.where(owns_mid_or_later, hi, mid)
    return lo


@triton.jit
def task_count(cu_seqlens, chunk_offsets, num_seqs, num_heads, CHUNK: tl.constexpr, SCHEDULE: tl.constexpr):
    """How many tasks this program runs: 0 or 1 for ``rect`` and ``flat``, a strided share for
    ``persistent``."""
    if SCHEDULE == "rect":
        seq = tl.program_id(1)
        seq_len = tl.load(cu_seqlens + seq + 1) - tl.load(cu_seqlens + seq)
        count = (tl.program_id(0) * CHUNK < seq_len).to(tl.int32)
    elif SCHEDULE == "flat":
        count = (tl.program_id(0) < tl.load(chunk_offsets + num_seqs)).to(tl.int32)
    else:
        tasks = tl.load(chunk_offsets + num_seqs) * num_heads
        count = tl.cdiv(tl.maximum(tasks - tl.program_id(0), 0), tl.num_programs(0))
    return count


@triton.jit
def task_at(i, cu_seqlens, chunk_offsets, num_seqs, SCHEDULE: tl.constexpr):
    """Task ``i`` of this program: ``(seq_start, seq_len, chunk, head)``, where ``seq_start`` is
    the sequence's first packed row, ``seq_len`` its length and ``chunk`` the chunk's index
    within the sequence (it covers rows ``chunk * C ..`` of the sequence)."""
    if SCHEDULE == "rect":
        chunk = tl.program_id(0)
        seq = tl.program_id(1)
        head = tl.program_id(2)
    else:
        if SCHEDULE == "flat":
            flat_chunk = tl.program_id(0)
            head = tl.program_id(1)
        else:
            active = tl.load(chunk_offsets + num_seqs)
            task = tl.program_id(0) + i * tl.num_programs(0)
            head = task // active
            flat_chunk = task % active
        seq = find_sequence(chunk_offsets, flat_chunk, num_seqs)
        chunk = flat_chunk - tl.load(chunk_offsets + seq)
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    return seq_start, seq_len, chunk, head
