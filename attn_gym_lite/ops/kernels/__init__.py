"""Triton ragged attention whose launch grid is a choice: rectangular, flat, persistent or dynamic.

* :mod:`.tasks`: the schedules as three device functions every kernel shares;
* :mod:`.forward`: online softmax over key blocks, log-sum-exp saved;
* :mod:`.backward`: the dQ pass over query chunks, then the dK/dV pass over key chunks;
* :mod:`.offsets`: ``chunk_offsets`` on the device, in one launch;
* :mod:`.inactive`: zeroing rows ``L..T-1`` with ``L`` read on the device;
* :mod:`.varlen`: the torch ops (forward, backward) that launch them.

Set ``TRITON_INTERPRET=1`` before importing this package to run the kernels on CPU tensors.
"""

from .varlen import INTERPRETED, AttentionConfig, KernelConfig, default_config, varlen_attention_triton

__all__ = ["INTERPRETED", "AttentionConfig", "KernelConfig", "default_config", "varlen_attention_triton"]
