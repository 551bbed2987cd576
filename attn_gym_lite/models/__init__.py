"""The modules the book trains, all taking packed batches with ``cu_seqlens``."""

from .attention import VarLenAttention
from .block import MASK_SITES, ShortConvAttentionBlock
from .lm import PackedLM

__all__ = ["MASK_SITES", "PackedLM", "ShortConvAttentionBlock", "VarLenAttention"]
