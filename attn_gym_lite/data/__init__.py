"""Data for fixed-capacity training, on the CPU: corpora, tokenizers, cutting, packing into
batches of ``T`` rows and ``N`` slots, loading, and measuring how full the batches are."""

from .batch import PackedBatch, batch_from_pieces
from .capacity import BucketPlan, plan_buckets, select_bucket
from .corpora import hf_dataset_texts, jsonl_texts, parquet_texts, python_stdlib_corpus, text_files
from .loader import PackedLoader
from .packing import BestFit, FirstFit, InOrder, PackingPolicy
from .recommend import Recommendation, recommend
from .segment import segment, segment_lengths
from .synthetic import fixed_count_loader, packed_batch_loader
from .tokenizer import HFTokenizer, TiktokenTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "PackedBatch",
    "batch_from_pieces",
    "packed_batch_loader",
    "fixed_count_loader",
    "python_stdlib_corpus",
    "text_files",
    "jsonl_texts",
    "parquet_texts",
    "hf_dataset_texts",
    "Tokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "load_tokenizer",
    "segment",
    "segment_lengths",
    "PackingPolicy",
    "InOrder",
    "FirstFit",
    "BestFit",
    "PackedLoader",
    "BucketPlan",
    "plan_buckets",
    "select_bucket",
    "Recommendation",
    "recommend",
]
