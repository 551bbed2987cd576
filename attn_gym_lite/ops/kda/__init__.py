"""KDA (Kimi Delta Attention) on packed batches: two independent eager references.

* :func:`kda_recurrent`: the per-token recurrence, the definition.
* :func:`kda_chunked`: the chunk-parallel form (WY / UT transform inside a chunk, the state carried
  from chunk to chunk), the algorithm a ragged kernel implements.

Both read ``cu_seqlens`` on the host, so neither may run inside a CUDA graph capture. See
:mod:`attn_gym_lite.ops.kda.reference` for the math, the conventions and the sources.
"""

from .reference import kda_chunked, kda_recurrent

__all__ = ["kda_chunked", "kda_recurrent"]
