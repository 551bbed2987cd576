"""KDA (Kimi Delta Attention) on packed batches: two eager references and the Triton kernels.

:func:`kda_recurrent` is the per-token definition, :func:`kda_chunked` the chunk-parallel form a
kernel implements, :func:`kda_triton` that form as graph-safe Triton kernels. The references read
``cu_seqlens`` on the host, so neither may run inside a CUDA graph capture.
"""

from .reference import kda_chunked, kda_recurrent

__all__ = ["kda_chunked", "kda_recurrent", "kda_triton"]


def __getattr__(name: str):
    # The kernels import Triton, which the references (and a CPU build of torch) do without.
    if name != "kda_triton":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..triton_support import missing_triton, triton_available

    if not triton_available():
        raise missing_triton("kda_triton", "the references kda_chunked and kda_recurrent "
                                           "(KDAAttention(impl='chunked')) need none")
    from .chunked_triton import kda_triton

    return kda_triton
