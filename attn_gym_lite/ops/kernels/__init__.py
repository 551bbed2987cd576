"""Triton ragged attention whose launch grid is a choice: rectangular, flat or persistent.

* :mod:`.tasks`: the three schedules as two device functions (how many tasks a program runs,
  which chunk each is), shared by every kernel.
* :mod:`.forward`: the forward kernel (online softmax over key blocks, log-sum-exp saved).
* :mod:`.backward`: the dQ kernel (over query chunks) and the dK/dV kernel (over key chunks).
* :mod:`.inactive`: zeroing rows ``L..T-1`` with ``L`` read on the device.
* :mod:`.varlen`: argument checks, launch grids and the autograd Function.

Set ``TRITON_INTERPRET=1`` before importing this package to run the same kernels on CPU tensors
(Triton's interpreter: slow, for small shapes and tests).
"""

try:
    from .varlen import INTERPRETED, AttentionConfig, KernelConfig, default_config, varlen_attention_triton
except ModuleNotFoundError as error:
    if error.name != "triton":
        raise
    from ..triton_support import missing_triton

    raise missing_triton("attn_gym_lite.ops.kernels (the Triton kernels)",
                         "varlen_attention(impl='auto') runs the reference without it") from error

__all__ = ["INTERPRETED", "AttentionConfig", "KernelConfig", "default_config", "varlen_attention_triton"]
