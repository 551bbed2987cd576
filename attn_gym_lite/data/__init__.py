"""Data for fixed-capacity training: corpora, tokenizers, cutting, packing, loading, measuring.

A CUDA graph replays fixed shapes, so every batch has the same capacity (``T`` token rows,
``N`` sequence slots) and only its active part (``L`` tokens in ``M`` sequences) changes. Rows
the loader leaves empty are padding the GPU computes for nothing; this subpackage makes the
batches and measures how full they are. One concept per module:

* :mod:`.batch`: :class:`PackedBatch`, the container a training loop copies into its static
  buffers, and :func:`batch_from_pieces`;
* :mod:`.corpora`: document strings from the stdlib (the offline default), text files, JSONL,
  Parquet, or a streamed Hugging Face dataset;
* :mod:`.tokenizer`: the :class:`Tokenizer` protocol, ``tokenizer.json`` and tiktoken
  tokenizers, :func:`load_tokenizer`;
* :mod:`.segment`: cutting long documents into pieces (the boundary rule);
* :mod:`.packing`: the packing policies (:class:`InOrder`, :class:`FirstFit`,
  :class:`BestFit`) and the bound on ``M`` each guarantees;
* :mod:`.loader`: :class:`PackedLoader`, the one loader (any policy, shuffled, prefetched,
  pinned, resumable);
* :mod:`.synthetic`: batches of a prescribed shape: :func:`packed_batch_loader` (random ids) and
  :func:`fixed_count_loader` (real text, a fixed number of documents per batch);
* :mod:`.study`: measuring a corpus and how well each policy packs it;
* :mod:`.quantiles`: the package's one sample-quantile definition (nearest-rank for the data
  statistics, linear for the spread of timings);
* :mod:`.recommend`: choosing ``B`` and ``N`` for a padding budget, and whether one graph is enough;
* :mod:`.capacity`: choosing graph-bucket capacities from data (:func:`plan_buckets`) and picking
  one for a batch (:func:`select_bucket`).

Everything here runs on the CPU and is deterministic.
"""

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
