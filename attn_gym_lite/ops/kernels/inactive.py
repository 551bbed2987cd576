"""Zero the inactive rows ``L..T-1`` of a packed ``[T, ...]`` tensor, reading ``L`` on the device.

The attention kernels write only active rows. A graph captured at capacity ``T`` hands the same
output buffers to every replay, so rows past this replay's ``L`` would otherwise hold whatever an
earlier, longer batch left there, or uninitialised memory, and a NaN there poisons any reduction
over rows (``X^T dY``). This kernel makes those rows defined at the cost of writing only them:
``(T - L)`` rows, found from ``cu_seqlens[-1]`` without a host read, by a fixed grid of workers
striding over the tail.

Source: the seed article, section "Correctness tangent".
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def zero_inactive_rows_kernel(X, cu_seqlens, num_seqs, num_rows, row_elems, BLOCK: tl.constexpr):
    """``X`` contiguous ``[num_rows, row_elems]``; zero its rows from ``cu_seqlens[num_seqs]`` on.
    ``row_elems`` must be a multiple of 16 (Triton then knows both bounds below are). ``L`` is
    clamped into ``[0, num_rows]`` before use, so a malformed ``cu_seqlens`` (negative, or past
    ``T``) zeroes all rows or none, and never writes outside ``X``."""
    active_rows = tl.minimum(tl.maximum(tl.load(cu_seqlens + num_seqs), 0), num_rows)
    first = active_rows * row_elems
    total = num_rows * row_elems
    zeros = tl.zeros([BLOCK], X.dtype.element_ty)
    # Whole BLOCK-aligned blocks, the first one masked below `first`: aligned offsets and a mask
    # that is constant over 16 elements let the stores be 16-byte vectors.
    for block in range(first // BLOCK + tl.program_id(0), tl.cdiv(total, BLOCK), tl.num_programs(0)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        tl.store(X + offsets, zeros, mask=(offsets >= first) & (offsets < total))
