"""Whether Triton is installed, the one message that says what to install when it is not, and
the one rule for where the package's Triton kernels run (:func:`kernels_take`).

The package's dependencies leave Triton out (a CPU build of torch runs without it), so every
entry point that would import it asks :func:`triton_available` first or turns the failed import
into :func:`missing_triton`'s error.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

__all__ = ["kernels_take", "missing_triton", "triton_available"]


@functools.cache  # asked on every "auto" call: once per process, not a path search per call
def triton_available() -> bool:
    """Whether ``import triton`` can succeed here (looked up once per process).

    Returns:
        False where Triton is not installed, or its installation is broken (no spec).
    """
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def missing_triton(what: str, instead: str) -> ImportError:
    """The error for ``what`` (a function or module that needs Triton) where Triton is missing:
    what to install, and ``instead``, what runs without it. Returned, for the caller to raise.

    Args:
        what: the thing that needs Triton, e.g. ``"impl='triton'"``.
        instead: the alternative without Triton, e.g. ``"use impl='auto'"``.

    Returns:
        An ``ImportError`` naming both.

    Raises:
        TypeError: ``what`` or ``instead`` is not a str.
    """
    for name, value in (("what", what), ("instead", instead)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return ImportError(f"{what} needs the triton package, which is not installed: pip install 'triton>=3.6' "
                       f"(Linux); {instead}")


def kernels_take(x: object, interpreted: bool, dtypes: tuple) -> bool:
    """Whether the package's Triton kernels run on ``x`` here: compiled kernels take CUDA tensors,
    Triton's interpreter (``TRITON_INTERPRET=1``) CPU ones (never meta, never the other device),
    in one of ``dtypes``. The one place for that rule (the attention's and the short convolution's
    ``"auto"`` both ask it).

    Args:
        x: a tensor (its ``device`` and ``dtype`` are read; metadata only).
        interpreted: whether the kernels run under the interpreter (``kernels.INTERPRETED``).
        dtypes: the dtypes the kernels take there.

    Raises:
        TypeError: ``x`` is not a ``torch.Tensor``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    return x.device.type == ("cpu" if interpreted else "cuda") and x.dtype in dtypes
