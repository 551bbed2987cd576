"""The modules the book trains, all taking packed batches with ``cu_seqlens``."""

from .attention import VarLenAttention
from .block import MASK_SITES, ShortConvAttentionBlock
from .lm import PackedLM, PackedTransformer, packed_lm_loss, token_loss_sum

__all__ = ["MASK_SITES", "PackedLM", "PackedTransformer", "ShortConvAttentionBlock", "VarLenAttention",
           "packed_lm_loss", "token_loss_sum"]
