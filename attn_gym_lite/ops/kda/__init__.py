"""KDA (Kimi Delta Attention) on packed batches: two independent eager references and the kernels.

* :func:`kda_recurrent`: the per-token recurrence, the definition.
* :func:`kda_chunked`: the chunk-parallel form (WY / UT transform inside a chunk, the state carried
  from chunk to chunk), the algorithm a ragged kernel implements.
* :func:`kda_triton`: the same chunked form as Triton kernels on a flat grid over the chunks of
  the batch, differentiable, and safe to capture in a CUDA graph (no host read of ``cu_seqlens``).

The two references read ``cu_seqlens`` on the host, so neither may run inside a CUDA graph capture.
See :mod:`attn_gym_lite.ops.kda.reference` for the math, the conventions and the sources, and
:mod:`attn_gym_lite.ops.kda.chunked_triton` for the kernels.
"""

from ..triton_support import missing_triton
from .reference import kda_chunked, kda_recurrent

__all__ = ["kda_chunked", "kda_recurrent", "kda_triton"]


def __getattr__(name: str):
    # The kernels import Triton, which the references (and a CPU build of torch) do without: load
    # them on first use, so that the references and the KDA layer's "chunked"/"recurrent" cores
    # import where Triton is not installed.
    if name == "kda_triton":
        try:
            from .chunked_triton import kda_triton
        except ModuleNotFoundError as error:
            if error.name != "triton":
                raise
            raise missing_triton("kda_triton", "the references kda_chunked and kda_recurrent "
                                               "(KDAAttention(impl='chunked')) need none") from error
        return kda_triton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
