"""KDA on packed batches: :func:`kda_recurrent` (the definition) and :func:`kda_chunked` (the
chunked form), eager references, beside :func:`kda_triton`, that form as graph-safe Triton kernels."""

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
