"""Whether Triton is here, what to install when it is not, and where the package's kernels run.

The package's dependencies leave Triton out (a CPU build of torch runs without it): entry points
that need it ask :func:`triton_available` first, and the ``"auto"`` implementations fall back to
tensor ops without it.
"""

import importlib.util

import torch

__all__ = ["kernels_take", "missing_triton", "triton_available"]

_AVAILABLE = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether ``import triton`` can succeed (looked up once, at import)."""
    return _AVAILABLE


def missing_triton(what: str, instead: str) -> ImportError:
    """The error to raise where ``what`` needs Triton and it is missing; ``instead`` says what runs."""
    return ImportError(f"{what} needs the triton package, which is not installed: pip install 'triton>=3.6' "
                       f"(Linux); {instead}")


def kernels_take(x: torch.Tensor, interpreted: bool, dtypes: tuple) -> bool:
    """Whether the Triton kernels run on ``x``: CUDA tensors when compiled, CPU ones under the
    interpreter (``TRITON_INTERPRET=1``), in one of ``dtypes``."""
    return x.device.type == ("cpu" if interpreted else "cuda") and x.dtype in dtypes
