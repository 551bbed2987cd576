"""Tests for attn_gym_lite.data: packed batches, corpora, tokenizers and the loaders.

The checks use independent references: plain Python loops over the batch tensors, a byte
tokenizer whose token counts are obvious, and the documents re-tokenized one at a time.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import sys
import sysconfig
from dataclasses import FrozenInstanceError
from itertools import chain, pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ByteTokenizer, assert_batch_invariants, sequences_of

from attn_gym_lite import data
from attn_gym_lite.data import (
    InOrder,
    PackedBatch,
    PackedLoader,
    Tokenizer,
    fixed_count_loader,
    jsonl_texts,
    load_tokenizer,
    packed_batch_loader,
    parquet_texts,
    python_stdlib_corpus,
    text_files,
)
from attn_gym_lite.data.batch import batch_from_pieces, padded_batch
from attn_gym_lite.data.study import document_lengths

FIXTURES = Path(__file__).parent / "fixtures"
TINY_CORPUS = FIXTURES / "tiny_corpus"
TINY_JSONL = FIXTURES / "tiny.jsonl"


# ---------------------------------------------------------------------------------------------
# Reference checks
# ---------------------------------------------------------------------------------------------


def expected_pieces(documents, tokenizer, max_piece_tokens, min_document_tokens=2):
    """Documents tokenized one by one (not batched) and cut into consecutive pieces."""
    pieces = []
    for document in documents:
        ids = tokenizer.encode(document)
        if len(ids) < min_document_tokens:
            continue
        pieces += [
            ids[i : i + max_piece_tokens] for i in range(0, len(ids), max_piece_tokens)
        ]
    return pieces


def assert_packing(batches, pieces, token_capacity, sequence_capacity) -> None:
    """Batches hold exactly ``pieces``, in order, one per sequence, packed greedily."""
    assert batches, "the loader yielded nothing"
    for batch in batches:
        assert_batch_invariants(batch, token_capacity, sequence_capacity)
    packed = [sequence for batch in batches for sequence in sequences_of(batch)]
    assert packed == pieces
    assert list(chain.from_iterable(packed)) == list(chain.from_iterable(pieces))
    # Greedy and in order: a batch was closed only because its successor's first piece did not
    # fit the room left, or because all N slots were used.
    for current, following in pairwise(batches):
        first_length = len(sequences_of(following)[0])
        room = token_capacity - current.active_tokens
        assert first_length > room or current.active_sequences == sequence_capacity


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

PARQUET_TEXTS = [
    "First row of the parquet fixture.",
    None,
    "Row groups of two rows make the reader stream several batches.",
    "Ünïcödé row ✓",
    "",
    "Last row.",
]


@pytest.fixture(scope="session")
def parquet_path(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("parquet") / "tiny.parquet"
    table = pa.table(
        {"text": pa.array(PARQUET_TEXTS, pa.string()), "id": list(range(len(PARQUET_TEXTS)))}
    )
    pq.write_table(table, path, row_group_size=2)
    return path


@pytest.fixture(scope="session")
def small_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def small_bpe(small_cache):
    """The default tokenizer recipe, shrunk: vocab 512 on 100 kB of stdlib text."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_GYM_LITE_CACHE", str(small_cache))
        return load_tokenizer(vocab_size=512, max_training_bytes=100_000)


def tiny_documents(parquet_path) -> list[str]:
    return [*text_files(TINY_CORPUS), *jsonl_texts(TINY_JSONL), *parquet_texts(parquet_path)]


# ---------------------------------------------------------------------------------------------
# PackedBatch
# ---------------------------------------------------------------------------------------------


def make_batch(**overrides) -> PackedBatch:
    fields = dict(
        input_ids=torch.tensor([5, 6, 7, 0], dtype=torch.int64),
        labels=torch.tensor([6, 0, 0, 0], dtype=torch.int64),
        loss_mask=torch.tensor([True, False, False, False]),
        cu_seqlens=torch.tensor([0, 2, 3, 3], dtype=torch.int32),
        active_tokens=3,
        active_sequences=2,
        max_seqlen=2,
    )
    return PackedBatch(**(fields | overrides))


def test_packed_batch_properties_and_frozen():
    batch = make_batch()
    assert batch.token_capacity == 4 and batch.sequence_capacity == 3
    with pytest.raises(FrozenInstanceError):
        batch.active_tokens = 1


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (
            {"labels": torch.zeros(4, dtype=torch.int32)},
            TypeError,
            r"labels must be a 1-D torch.int64",
        ),
        ({"loss_mask": [True] * 4}, TypeError, r"loss_mask must be a torch.Tensor"),
        (
            {"cu_seqlens": torch.zeros(4, dtype=torch.int64)},
            TypeError,
            r"PackedBatch.cu_seqlens must have dtype torch.int32 .*got torch.int64",
        ),
        (
            {"labels": torch.zeros(3, dtype=torch.int64)},
            ValueError,
            r"labels must have T=4 rows.*got 3",
        ),
        (
            {"cu_seqlens": torch.zeros(1, dtype=torch.int32)},
            ValueError,
            r"PackedBatch.cu_seqlens must have at least 2 entries .*got shape \(1,\)",
        ),
        ({"active_tokens": 5}, ValueError, r"active_tokens must be an int in \[0, 4\], got 5"),
        ({"active_sequences": 4}, ValueError, r"active_sequences must be an int in \[0, 3\], got 4"),
        ({"max_seqlen": 2.0}, TypeError, r"max_seqlen must be an int in \[0, 3\], got 2.0"),
    ],
)
def test_packed_batch_rejects_bad_fields(overrides, error, match):
    with pytest.raises(error, match=match):
        make_batch(**overrides)


#: Three sequences of 5, 4 and 7 tokens in T = 16 rows, N = 3 slots: cu_seqlens [0, 5, 9, 16].
LENGTHS_5_4_7 = [5, 4, 7]


def _batch_5_4_7() -> PackedBatch:
    return batch_from_pieces([[i + 1] * n for i, n in enumerate(LENGTHS_5_4_7)], 16, 3)


def test_packed_batch_host_ints_are_what_cu_seqlens_says():
    batch = _batch_5_4_7()
    assert batch.cu_seqlens.tolist() == [0, 5, 9, 16]
    assert (batch.active_tokens, batch.active_sequences, batch.max_seqlen) == (
        sum(LENGTHS_5_4_7), len(LENGTHS_5_4_7), max(LENGTHS_5_4_7))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # Before: each was accepted, and the trainer trained on the contradiction silently.
        ({"active_tokens": 12}, r"PackedBatch.active_tokens must equal cu_seqlens\[-1\] = 16 .*got 12"),
        # An active_tokens below max_seqlen (7): the message used to blame max_seqlen ("must be an
        # int in [0, 5], got 7"), the field that agrees with cu_seqlens.
        ({"active_tokens": 5}, r"^PackedBatch.active_tokens must equal cu_seqlens\[-1\] = 16 \(L, the active tokens\), got 5$"),
        ({"max_seqlen": 3},
         r"PackedBatch.max_seqlen must equal the longest sequence in cu_seqlens \(sequence 2, 7 tokens\), got 3"),
        ({"max_seqlen": 9}, r"PackedBatch.max_seqlen must equal the longest sequence .*7 tokens.*got 9"),
        ({"active_sequences": 1},
         r"PackedBatch.active_sequences must equal the number of non-empty sequences in cu_seqlens \(M = 3\), got 1"),
        ({"cu_seqlens": torch.tensor([1, 5, 9, 16], dtype=torch.int32)}, r"PackedBatch.cu_seqlens\[0\] must be 0, got 1"),
        ({"cu_seqlens": torch.tensor([0, 9, 5, 16], dtype=torch.int32)},
         r"PackedBatch.cu_seqlens must be non-decreasing, but PackedBatch.cu_seqlens\[2\] = 5"),
        ({"cu_seqlens": torch.tensor([0, 5, 9, 17], dtype=torch.int32)},
         r"PackedBatch.cu_seqlens\[-1\] \(active tokens L\) must be <= token_capacity T = 16, got L = 17"),
    ],
)
def test_packed_batch_refuses_host_ints_that_contradict_cu_seqlens(overrides, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(_batch_5_4_7(), **overrides)


def test_packed_batch_counts_only_non_empty_sequences():
    # Empty sequences between and after the others: M counts the non-empty ones, max_seqlen the longest.
    fields = dict(input_ids=torch.arange(8), labels=torch.zeros(8, dtype=torch.int64),
                  loss_mask=torch.zeros(8, dtype=torch.bool),
                  cu_seqlens=torch.tensor([0, 3, 3, 5, 5], dtype=torch.int32))
    batch = PackedBatch(**fields, active_tokens=5, active_sequences=2, max_seqlen=3)
    assert batch.active_sequences == sum(1 for a, b in pairwise([0, 3, 3, 5, 5]) if b > a)
    with pytest.raises(ValueError, match=r"\(M = 2\), got 4"):
        PackedBatch(**fields, active_tokens=5, active_sequences=4, max_seqlen=3)
    empty = PackedBatch(**(fields | {"cu_seqlens": torch.zeros(5, dtype=torch.int32)}), active_tokens=0,
                        active_sequences=0, max_seqlen=0)
    assert empty.token_capacity == 8


def test_packed_batch_refuses_a_negative_label_on_a_counted_row():
    """Before: a -100 on a row loss_mask counts was accepted, and the loss then failed with torch's
    bare 'IndexError: Target -100 is out of bounds' (a device-side assert on CUDA)."""
    batch = _batch_5_4_7()
    counted = [t for t in range(16) if bool(batch.loss_mask[t])]
    assert counted[:2] == [0, 1] and 4 not in counted  # row 4 ends sequence 0: no target
    for value in (-100, -1):
        labels = batch.labels.clone()
        labels[[1, 2]] = value
        with pytest.raises(ValueError, match=rf"PackedBatch.labels must be >= 0 on the rows loss_mask counts, got "
                                             rf"labels\[1\] = {value} where loss_mask\[1\] is True \(2 such rows\); rows "
                                             r"without a target are excluded by loss_mask .*not by a -100 label"):
            dataclasses.replace(batch, labels=labels)
    # On rows the loss does not count, a label is never read: -100 there is harmless.
    labels = batch.labels.clone()
    labels[[4, 8, 15]] = -100
    assert dataclasses.replace(batch, labels=labels).labels[4] == -100


def test_packed_batch_on_a_device_checks_metadata_only():
    """Documented: a cu_seqlens off the CPU is not read (that would sync); ranges still hold."""
    meta = {name: getattr(_batch_5_4_7(), name).to("meta") for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
    batch = PackedBatch(**meta, active_tokens=12, active_sequences=1, max_seqlen=3)  # not read, so not refused
    assert batch.active_tokens == 12
    with pytest.raises(ValueError, match=r"active_tokens must be an int in \[0, 16\], got 17"):
        PackedBatch(**meta, active_tokens=17, active_sequences=1, max_seqlen=3)


def test_pin_memory():
    batch = make_batch()
    pinned = batch.pin_memory()
    if not torch.cuda.is_available():
        assert pinned is batch  # documented no-op without CUDA
        return
    for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"):
        assert getattr(pinned, name).is_pinned()
        assert torch.equal(getattr(pinned, name), getattr(batch, name))
    assert (pinned.active_tokens, pinned.active_sequences) == (3, 2)


# ---------------------------------------------------------------------------------------------
# Synthetic loader
# ---------------------------------------------------------------------------------------------


def test_synthetic_loader_shapes_and_schedule():
    T, N, vocab, count = 256, 16, 1000, 6
    batches = list(packed_batch_loader(count, T, vocab, N, seed=3))
    assert len(batches) == count
    smallest = max(N, T // 8)
    for i, batch in enumerate(batches):
        assert_batch_invariants(batch, T, N, second_half_loss=True)
        expected_L = round(T + (smallest - T) * i / (count - 1))
        assert batch.active_tokens == expected_L
        assert batch.active_sequences == max(1, round(N * expected_L / T))
        assert int(batch.input_ids.max()) < vocab
    # A graph captured on the first batch sees the largest shapes.
    assert (batches[0].active_tokens, batches[0].active_sequences) == (T, N)
    assert batches[-1].active_tokens == smallest


def test_synthetic_loader_is_seeded():
    first = list(packed_batch_loader(3, 128, 50, 8, seed=1))
    again = list(packed_batch_loader(3, 128, 50, 8, seed=1))
    other = list(packed_batch_loader(3, 128, 50, 8, seed=2))
    for a, b in zip(first, again):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.cu_seqlens, b.cu_seqlens)
    assert not all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(first, other))


def test_synthetic_loader_single_batch_is_full():
    (batch,) = packed_batch_loader(1, 64, 10, 64)
    assert_batch_invariants(batch, 64, 64, second_half_loss=True)
    assert (batch.active_tokens, batch.active_sequences, batch.max_seqlen) == (64, 64, 1)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0, 64, 10, 4), {}, ValueError, r"num_batches must be an int >= 1, got 0"),
        ((2, 0, 10, 4), {}, ValueError, r"token_capacity must be an int >= 1, got 0"),
        ((2, 64, 10, 65), {}, ValueError, r"sequence_capacity must be an int in \[1, 64\], got 65"),
        ((2, 64, 0, 4), {}, ValueError, r"vocab_size must be an int in \[1, 9223372036854775807\], got 0"),
        ((2, 64.0, 10, 4), {}, TypeError, r"token_capacity must be an int >= 1, got 64.0"),
        ((2, 64, 10, True), {}, TypeError, r"sequence_capacity must be an int in \[1, 64\], got True"),
        ((2, 64, 10, 4), {"seed": -1}, ValueError, r"seed must be an int >= 0, got -1"),
    ],
)
def test_synthetic_loader_rejects_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        packed_batch_loader(*args, **kwargs)  # raises on call, before the first batch


# ---------------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------------


def test_text_files_sorted_and_exact():
    documents = list(text_files(TINY_CORPUS))
    names = ["a.txt", "b.txt", "nested/c.txt"]
    assert documents == [(TINY_CORPUS / name).read_text(encoding="utf-8") for name in names]
    assert list(text_files(TINY_CORPUS, pattern="*.md")) == [
        (TINY_CORPUS / "notes.md").read_text(encoding="utf-8")
    ]


def test_text_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"folder='.*missing': no such folder"):
        text_files(tmp_path / "missing")
    # Before: a file was reported as "no such folder".
    with pytest.raises(FileNotFoundError, match=r"folder='.*a.txt' is a file, expected a folder"):
        text_files(TINY_CORPUS / "a.txt")
    with pytest.raises(FileNotFoundError, match=r"matches pattern='\*\*/\*.rst'"):
        text_files(TINY_CORPUS, pattern="**/*.rst")
    # Before (reliability tail): "../*" read the files beside folder, "." raised a bare IndexError.
    (tmp_path / "outside.txt").write_text("not in the folder")
    (tmp_path / "inside" / "nested").mkdir(parents=True)
    (tmp_path / "inside" / "nested" / "in.txt").write_text("in the folder")
    for pattern in ("", "../*", "../*.txt", "nested/../../*.txt", ".", "./"):
        with pytest.raises(ValueError, match=r"^pattern must be a non-empty relative glob pattern of files inside folder "
                                             rf"\(no '..' part\), got {re.escape(repr(pattern))}$"):
            text_files(tmp_path / "inside", pattern=pattern)
    assert list(text_files(tmp_path / "inside")) == list(text_files(tmp_path / "inside", "./**/*.txt")) == ["in the folder"]
    with pytest.raises(TypeError, match=r"folder must be a str or os.PathLike, got int"):
        text_files(3)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt' is not valid UTF-8"):
        list(text_files(tmp_path))


def test_jsonl_texts_skips_blank_lines_and_nulls():
    expected = [
        json.loads(line)["text"]
        for line in TINY_JSONL.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line)["text"] is not None
    ]
    assert len(expected) == 3
    assert list(jsonl_texts(TINY_JSONL)) == expected


def test_jsonl_texts_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"path='.*nope.jsonl': no such file"):
        jsonl_texts(tmp_path / "nope.jsonl")
    # Before: an existing folder was reported as "no such file".
    with pytest.raises(FileNotFoundError, match=r"path='.*' is a directory, expected a file"):
        jsonl_texts(tmp_path)
    # A wrong field fails at call time, from the first record.
    with pytest.raises(ValueError, match=r"field='body' is missing from line 1 .*\['id', 'text'\]"):
        jsonl_texts(TINY_JSONL, field="body")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken.jsonl' line 2 is not JSON"):
        list(jsonl_texts(broken))
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": "ok"}\n{"text": 7}\n', encoding="utf-8")
    with pytest.raises(TypeError, match=r"field='text' on line 2 .* must be a string, got int"):
        list(jsonl_texts(numbers))


def test_text_files_and_jsonl_texts_read_a_utf8_bom(tmp_path):
    """Before: jsonl_texts refused a UTF-8 file with a byte order mark ("Unexpected UTF-8 BOM"),
    and text_files kept the mark as a character of the first document."""
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + '{"text": "caf\u00e9"}\n{"text": "b"}\n'.encode())
    assert list(jsonl_texts(tmp_path / "bom.jsonl")) == ["caf\u00e9", "b"]
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    assert list(text_files(tmp_path)) == ["hello"]


def test_parquet_texts_decodes_a_dictionary_column(tmp_path):
    """Before: a dictionary-encoded string column (pandas' categorical) was refused with
    "column='text' of ... must hold strings, got dictionary<values=string, indices=int8, ...>"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["a cat", None, "a dog", "a cat"]
    for values_type in (pa.string(), pa.large_string()):
        path = tmp_path / f"categorical_{values_type}.parquet"
        column = pa.array(texts, values_type).dictionary_encode()
        assert pa.types.is_dictionary(column.type)
        pq.write_table(pa.table({"text": column}), path, row_group_size=2)
        assert pa.types.is_dictionary(pq.ParquetFile(path).schema_arrow.field("text").type)
        assert list(parquet_texts(path, batch_size=3)) == ["a cat", "a dog", "a cat"]
    # A dictionary of non-strings is still refused (Parquet reads an int dictionary back as int64).
    numbers = tmp_path / "int_dictionary.parquet"
    pq.write_table(pa.table({"n": pa.array([1, 2, 1]).dictionary_encode()}), numbers)
    with pytest.raises(TypeError, match=r"column='n' of .* must hold strings \(string, large_string, string_view, "
                                        r"or a dictionary of them\), got int64"):
        parquet_texts(numbers, column="n")


def test_parquet_texts_streams_rows_in_order(parquet_path):
    expected = [text for text in PARQUET_TEXTS if text is not None]
    assert list(parquet_texts(parquet_path, batch_size=1)) == expected
    assert list(parquet_texts(parquet_path)) == expected


def test_parquet_texts_errors(parquet_path, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"path='.*nope.parquet': no such file"):
        parquet_texts(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match=r"path='.*' is a directory, expected a file"):
        parquet_texts(tmp_path)
    with pytest.raises(ValueError, match=r"column='body' is not in .*columns: \['text', 'id'\]"):
        parquet_texts(parquet_path, column="body")
    with pytest.raises(TypeError, match=r"column='id' of .* must hold strings .*, got int64"):
        parquet_texts(parquet_path, column="id")
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1, got 0"):
        parquet_texts(parquet_path, batch_size=0)


def test_python_stdlib_corpus_is_real_source():
    documents = list(python_stdlib_corpus())
    assert len(documents) > 300
    assert all(isinstance(document, str) and document.strip() for document in documents)
    assert sum("def " in document for document in documents) > 200
    assert documents == list(python_stdlib_corpus())  # deterministic order
    assert list(python_stdlib_corpus(limit=5)) == documents[:5]
    assert list(python_stdlib_corpus(limit=0)) == []

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    contents = set(documents)
    assert (stdlib / "os.py").read_text(encoding="utf-8") in contents
    # Test suites are left out (some distributions ship none; then there is nothing to check).
    test_files = [
        path
        for path in sorted((stdlib / "test").glob("test_*.py"))[:20]
        if path.stat().st_size > 2000
    ]
    assert not any(path.read_bytes().decode("utf-8", "replace") in contents for path in test_files)


def test_python_stdlib_corpus_rejects_bad_limit():
    with pytest.raises(ValueError, match=r"limit must be an int >= 0, got -1"):
        python_stdlib_corpus(limit=-1)
    with pytest.raises(TypeError, match=r"limit must be an int >= 0, got '3'"):
        python_stdlib_corpus(limit="3")


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

ROUND_TRIP_TEXTS = [
    "def f(x):\n    return x + 1\n",
    "  leading spaces, tabs\tand\r\nCRLF\n\n",
    "Un café ☕, 日本語, emoji 🚀 and a literal <|endoftext|> marker",
    "",
]


def test_default_tokenizer_round_trips_and_caches(small_bpe, small_cache, monkeypatch):
    assert isinstance(small_bpe, Tokenizer)
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    assert small_bpe.name == f"stdlib-bpe-{python}-vocab512-100000B"
    cached = small_cache / small_bpe.name / "tokenizer.json"
    assert cached.is_file()
    assert 257 <= small_bpe.vocab_size <= 512
    for text in ROUND_TRIP_TEXTS:
        ids = small_bpe.encode(text)
        assert all(0 <= token < small_bpe.vocab_size for token in ids)
        assert small_bpe.decode(ids) == text
    assert small_bpe.encode_batch(ROUND_TRIP_TEXTS) == [
        small_bpe.encode(t) for t in ROUND_TRIP_TEXTS
    ]
    # BPE merges make code shorter than its bytes.
    source = next(python_stdlib_corpus())
    assert len(small_bpe.encode(source)) < 0.6 * len(source.encode("utf-8"))

    # A second load reads the cache instead of training.
    monkeypatch.setenv("ATTN_GYM_LITE_CACHE", str(small_cache))
    monkeypatch.setattr(data.tokenizer, "_train_stdlib_bpe", lambda *args: pytest.fail("retrained"))
    again = load_tokenizer(vocab_size=512, max_training_bytes=100_000)
    assert again.encode(ROUND_TRIP_TEXTS[2]) == small_bpe.encode(ROUND_TRIP_TEXTS[2])
    # ... and loading that file by path gives the same tokenizer.
    by_path = load_tokenizer(cached)
    assert by_path.vocab_size == small_bpe.vocab_size
    assert by_path.encode(source) == small_bpe.encode(source)


def test_load_tokenizer_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"spec='.*missing.json': no such file"):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=r"spec='.*' is a directory, expected a file"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"only apply to the default tokenizer .*spec='x.json'"):
        load_tokenizer("x.json", vocab_size=1000)
    with pytest.raises(ValueError, match=r"vocab_size must be an int >= 257, got 100"):
        load_tokenizer(vocab_size=100)
    with pytest.raises(ValueError, match=r"max_training_bytes must be an int >= 1, got 0"):
        load_tokenizer(max_training_bytes=0)
    with pytest.raises(TypeError, match=r"spec must be a str or os.PathLike, got int"):
        load_tokenizer(123)
    # A bare encoding or model name: before, only "spec='gpt2': no such file".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^spec='cl100k_base': no such file; a tiktoken encoding is spelled "
                                                r"'tiktoken:<name>' \(e.g. 'tiktoken:cl100k_base'\), a Hugging Face "
                                                r"tokenizer is the path of its tokenizer.json"):
        load_tokenizer("cl100k_base")
    with pytest.raises(TypeError, match=r"tokenizer must be a tokenizers.Tokenizer, got <class 'int'>"):
        data.HFTokenizer(1, "x")
    with pytest.raises(TypeError, match=r"name must be a str, got None"):
        data.HFTokenizer(load_tokenizer(vocab_size=512, max_training_bytes=100_000).backend, None)
    with pytest.raises(TypeError, match=r"encoding must be a tiktoken.Encoding, got int"):
        data.TiktokenTokenizer(1)
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # as if tiktoken were not installed
    with pytest.raises(ValueError, match=r"spec='tiktoken:gpt2' needs tiktoken"):
        load_tokenizer("tiktoken:gpt2")


def test_tiktoken_specs(monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    with pytest.raises(ValueError, match=r"spec='tiktoken:nope': unknown encoding"):
        load_tokenizer("tiktoken:nope")

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(RuntimeError, match=r"spec='tiktoken:gpt2': could not load the encoding"):
        load_tokenizer("tiktoken:gpt2")

    # An encoding built locally stands in for a downloaded one.
    local = tiktoken.Encoding(
        name="local-bytes",
        pat_str=r"\S+|\s+",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={},
    )
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["local-bytes"])
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: local)
    tokenizer = load_tokenizer("tiktoken:local-bytes")
    assert isinstance(tokenizer, Tokenizer)
    assert (tokenizer.name, tokenizer.vocab_size) == ("tiktoken:local-bytes", 256)
    text = ROUND_TRIP_TEXTS[2]
    assert tokenizer.encode(text) == list(text.encode("utf-8"))  # special text stays ordinary
    assert tokenizer.encode_batch([text, "ab"]) == [list(text.encode("utf-8")), [97, 98]]
    assert tokenizer.decode(tokenizer.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# The loader on real text, in corpus order (shuffle_buffer=1, in-order packing)
# ---------------------------------------------------------------------------------------------


def in_order(token_capacity, sequence_capacity, **kwargs) -> list[PackedBatch]:
    """Every batch of one pass of PackedLoader that keeps the corpus order, packed in order."""
    kwargs = {"policy": InOrder(), "shuffle_buffer": 1, "prefetch": 0} | kwargs
    return list(PackedLoader(token_capacity, sequence_capacity, **kwargs))


def test_loader_on_fixture_corpus_tokenizes_as_one_document_at_a_time(small_bpe, parquet_path):
    documents = tiny_documents(parquet_path)
    T, N, longest = 32, 4, 12
    batches = in_order(T, N, corpus=documents, tokenizer=small_bpe, max_piece_tokens=longest)
    pieces = expected_pieces(documents, small_bpe, longest)
    assert_packing(batches, pieces, T, N)
    assert max(map(len, pieces)) == longest  # some documents were split
    assert any(batch.active_sequences > 1 for batch in batches)  # and some packed together
    # Re-running gives identical batches.
    again = in_order(T, N, corpus=documents, tokenizer=small_bpe, max_piece_tokens=longest)
    for first, second in zip(batches, again, strict=True):
        assert torch.equal(first.input_ids, second.input_ids)
        assert torch.equal(first.cu_seqlens, second.cu_seqlens)


def test_loader_on_stdlib_with_tokenizer_path(small_bpe, small_cache):
    tokenizer_path = small_cache / small_bpe.name / "tokenizer.json"
    documents = list(python_stdlib_corpus(limit=12))
    T, N = 1024, 8
    batches = in_order(T, N, corpus=documents, tokenizer=str(tokenizer_path))
    assert_packing(batches, expected_pieces(documents, small_bpe, T), T, N)


def test_loader_splits_long_documents_exactly():
    batches = in_order(16, 4, corpus=["a" * 25], tokenizer=ByteTokenizer(), max_piece_tokens=10)
    # Pieces of 10, 10, 5 tokens; the second 10 does not fit next to the first (10 + 10 > 16).
    assert [batch.cu_seqlens.tolist() for batch in batches] == [
        [0, 10, 10, 10, 10],
        [0, 10, 15, 15, 15],
    ]
    assert [(b.active_tokens, b.active_sequences, b.max_seqlen) for b in batches] == [
        (10, 1, 10),
        (15, 2, 10),
    ]
    # Each piece is its own sequence: its last token has no target.
    assert batches[1].loss_mask.tolist() == [True] * 9 + [False] + [True] * 4 + [False] * 2


def test_loader_respects_sequence_capacity():
    corpus = [f"d{i}" for i in range(10)]
    batches = in_order(64, 3, corpus=corpus, tokenizer=ByteTokenizer())
    assert [batch.active_sequences for batch in batches] == [3, 3, 3, 1]
    assert_packing(batches, [list(doc.encode()) for doc in corpus], 64, 3)


def test_loader_min_document_tokens():
    corpus = ["a", "bc", "", "def"]
    kept = in_order(8, 4, corpus=corpus, tokenizer=ByteTokenizer())
    assert [s for b in kept for s in sequences_of(b)] == [list(b"bc"), list(b"def")]
    kept_all = in_order(8, 4, corpus=corpus, tokenizer=ByteTokenizer(), min_document_tokens=1)
    assert [s for b in kept_all for s in sequences_of(b)] == [list(b"a"), list(b"bc"), list(b"def")]


def test_a_document_of_another_type_is_refused_naming_its_corpus_index():
    with pytest.raises(TypeError, match=r"corpus\[0\] must be a document string or a list/tuple of token ids, got bytes"):
        in_order(8, 4, corpus=[b"abc"], tokenizer=ByteTokenizer())
    with pytest.raises(TypeError, match=r"corpus\[1\] must be a document string or a list/tuple of token ids, got int"):
        in_order(8, 4, corpus=["abc", 123], tokenizer=ByteTokenizer())
    # The study's tokenizing pass checks its corpus as it is given: a list now, naming the index.
    with pytest.raises(TypeError, match=r"corpus\[1\] must be a document string, got int"):
        document_lengths(["abc", 123], ByteTokenizer())


@pytest.mark.parametrize("seed", range(40))
def test_loader_in_corpus_order_random_cases(seed):
    """Random corpora and capacities, including empty documents and T = 1."""
    rng = random.Random(seed)
    token_capacity = rng.randint(1, 48)
    sequence_capacity = rng.randint(1, token_capacity)
    longest = rng.randint(1, token_capacity)
    minimum = rng.randint(1, 3)
    alphabet = "ab \né日🚀"  # 1- to 4-byte UTF-8 characters
    documents = [
        "".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(rng.randint(0, 12))
    ]
    tokenizer = ByteTokenizer()
    arguments = dict(corpus=documents, tokenizer=tokenizer, max_piece_tokens=longest, min_document_tokens=minimum)
    pieces = expected_pieces(documents, tokenizer, longest, minimum)
    if not pieces:
        with pytest.raises(ValueError, match="corpus must hold at least one document|corpus yielded no document"):
            in_order(token_capacity, sequence_capacity, **arguments)
        return
    assert_packing(in_order(token_capacity, sequence_capacity, **arguments), pieces, token_capacity, sequence_capacity)


# ---------------------------------------------------------------------------------------------
# The SFT-like loader and the padded layout
# ---------------------------------------------------------------------------------------------


def test_fixed_count_loader_holds_M_documents_of_real_text():
    stream = torch.arange(1000, dtype=torch.int64)  # stand-in ids: every position distinct
    batches = list(fixed_count_loader(stream, 12, 256, 8, min_fill=0.25, seed=5))
    assert len(batches) == 12
    position = 0
    for batch in batches:
        assert_batch_invariants(batch, 256, 8, second_half_loss=True)
        assert batch.active_sequences == 8 and 64 <= batch.active_tokens <= 256
        # the documents are the next window of the stream, in order
        window = (torch.arange(position, position + batch.active_tokens) % 1000)
        assert torch.equal(batch.input_ids[: batch.active_tokens], stream[window])
        position += batch.active_tokens
    fills = [b.active_tokens for b in batches]
    assert max(fills) - min(fills) > 64, "L must vary from batch to batch"
    again = list(fixed_count_loader(stream, 12, 256, 8, min_fill=0.25, seed=5))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, again))


def test_fixed_count_loader_checks_its_arguments():
    with pytest.raises(ValueError, match=r"documents_per_batch must be an int in \[1, 26\], got 30"):
        fixed_count_loader(torch.arange(500), 2, 256, 30)
    with pytest.raises(ValueError, match=r"min_fill must be a finite real number > 0.0 <= 1.0, got 1.5"):
        fixed_count_loader(torch.arange(500), 2, 256, 4, min_fill=1.5)
    with pytest.raises(ValueError, match="tokens must hold at least token_capacity = 256 ids, got 100"):
        fixed_count_loader(torch.arange(100), 2, 256, 4)


def test_fixed_count_loader_names_tokens_that_are_not_ids():
    """Before: float ids were truncated (1.5 -> 1) and a bool tensor read as ids 0/1, silently; a
    negative id failed at the first batch as a PackedBatch label error; a string or None failed
    with torch's bare "new(): invalid data type"."""
    expected = r"tokens must be a sequence, tensor or array of token ids \(ints >= 0\)"
    cases = [
        ([1.5] * 300, TypeError, expected + r", got torch.float32 values \(from list\)"),
        (torch.ones(300, dtype=torch.bool), TypeError, expected + ", got a torch.bool tensor"),
        (torch.rand(300), TypeError, expected + ", got a torch.float32 tensor"),
        ("abc", TypeError, expected + ", got str"),
        (None, TypeError, expected + ", got NoneType"),
        ([3] * 299 + [-2], ValueError, r"tokens must hold ids >= 0, got tokens\[299\] = -2"),
        (torch.arange(300, device="meta"), ValueError, r"tokens must hold values"),
        # Reliability tail. Before: 2**64 - 1 in a uint64 array wrapped to -1 and was reported as
        # "got tokens[0] = -1", a value the caller never gave.
        (np.array([5] * 299 + [2**64 - 1], dtype=np.uint64), ValueError,
         r"^tokens must hold ids in \[0, 2\*\*63\), got tokens\[299\] = 18446744073709551615$"),
    ]
    for tokens, error, match in cases:
        with pytest.raises(error, match=match):
            fixed_count_loader(tokens, 2, 256, 4)
    assert next(fixed_count_loader(np.arange(300, dtype=np.uint64), 1, 256, 4)).input_ids.dtype == torch.int64
    # packed_batch_loader's vocab_size: torch.randint needs an int64 bound (2**63 failed at the first batch).
    with pytest.raises(ValueError, match=r"^vocab_size must be an int in \[1, 9223372036854775807\], got 9223372036854775808$"):
        packed_batch_loader(3, 64, 2**63, 4)
    ids = list(range(300))
    assert torch.equal(next(fixed_count_loader(ids, 1, 256, 4)).input_ids,
                       next(fixed_count_loader(torch.tensor(ids, dtype=torch.int32), 1, 256, 4)).input_ids)


def test_padded_batch_is_the_padded_layout_of_the_same_documents():
    batch = next(iter(packed_batch_loader(1, 64, 50, 4, seed=1)))
    padded = padded_batch(batch)
    width, rows = batch.max_seqlen, batch.active_sequences
    assert padded.input_ids.shape == (rows * width,) and padded.cu_seqlens.tolist() == list(range(0, rows * width + 1, width))
    bounds = batch.cu_seqlens.tolist()
    for r in range(rows):
        start, end = bounds[r], bounds[r + 1]
        row = slice(r * width, (r + 1) * width)
        for field in ("input_ids", "labels", "loss_mask"):
            expected = getattr(batch, field)[start:end]
            assert torch.equal(getattr(padded, field)[row][: end - start], expected)
            assert not getattr(padded, field)[row][end - start:].any()  # padding: id 0, label 0, no loss
    assert int(padded.loss_mask.sum()) == int(batch.loss_mask.sum())


def test_files_of_the_wrong_kind_name_their_path(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"path='.*weights.bin' must be a UTF-8 JSON Lines file, but it is not UTF-8"):
        list(jsonl_texts(binary))
    with pytest.raises(ValueError, match=r"path='.*weights.bin' must be a Parquet file"):
        parquet_texts(binary)
    with pytest.raises(ValueError, match=r"spec='.*weights.bin' must be a Hugging Face tokenizer.json file"):
        load_tokenizer(binary)


def test_packed_batch_refuses_loss_mask_on_padding_rows():
    """Before: loss_mask True on rows L..T-1 was accepted (the docstring says padding rows have it
    False) and the loss then counted padding."""
    batch = batch_from_pieces([[1] * n for n in LENGTHS_5_4_7], 20, 4)  # L = 16, rows 16..19 padding
    assert batch.active_tokens == 16 and not batch.loss_mask[16:].any()
    mask = batch.loss_mask.clone()
    mask[[17, 19]] = True
    with pytest.raises(ValueError, match=r"^PackedBatch.loss_mask must be False on the padding rows L..T-1 = 16..19 "
                                         r"\(the loss would count padding\), got loss_mask\[17\] = True \(2 such rows\)$"):
        dataclasses.replace(batch, loss_mask=mask)
    mask = batch.loss_mask.clone()
    mask[16:] = True
    with pytest.raises(ValueError, match=r"got loss_mask\[16\] = True \(4 such rows\)"):
        dataclasses.replace(batch, loss_mask=mask)
    # Any mask on the active rows that have a next token is the caller's choice (a prompt/response
    # split, say); the last token of each sequence (rows 4, 8, 15) has none.
    mask = torch.zeros(20, dtype=torch.bool)
    mask[:16] = True
    mask[[4, 8, 15]] = False
    assert int(dataclasses.replace(batch, loss_mask=mask).loss_mask.sum()) == 13


def test_packed_batch_refuses_targets_that_cross_a_document_or_are_not_shifted():
    """Before: a label crossing into the next document (the classic packing bug: labels rolled over
    the whole batch, the last token of a document trained to predict the next document's first)
    and unshifted labels were both accepted, though the docstring promises next-token targets."""
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0])
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    rolled = torch.roll(ids, -1)
    crossing = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)  # row 2 ends document 0
    with pytest.raises(ValueError, match=r"^PackedBatch.loss_mask must be False on each sequence's last token .* got "
                                         r"loss_mask\[2\] = True on the last token of the sequence ending at row 3 "
                                         r"\(1 such rows\)$"):
        PackedBatch(ids, rolled, crossing, cu, 7, 2, 4)
    within = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"labels\[t\] == input_ids\[t \+ 1\], on the rows loss_mask counts, got "
                                         r"labels\[0\] = 1 and input_ids\[1\] = 2 \(5 such rows"):
        PackedBatch(ids, ids.clone(), within, cu, 7, 2, 4)
    batch = PackedBatch(ids, rolled, within, cu, 7, 2, 4)  # the right targets: rows 0, 1, 3, 4, 5
    assert batch.labels[within].tolist() == [2, 3, 5, 6, 7]


def test_tiktoken_tokenizer_wraps_an_encoding():
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)}
    encoding = tiktoken.Encoding("bytes", pat_str=r".", mergeable_ranks=ranks, special_tokens={})
    tokenizer = data.TiktokenTokenizer(encoding)
    assert tokenizer.name == "tiktoken:bytes" and tokenizer.vocab_size == 256
    assert tokenizer.decode(tokenizer.encode("ab")) == "ab"


def test_tokenizer_methods_refuse_what_they_cannot_encode_or_decode(small_bpe):
    """Break-it (reliability tail). Before: HF's encode_batch("abc") encoded each character as a
    document ([[65], [66], [67]] with the default tokenizer) and decode([99999, 5]) dropped the id past
    the vocabulary without a word; encode(None), decode([1.5]), decode(None) and decode([-1]) raised
    the backend's bare errors ("TextInputSequence must be str", OverflowError, ...)."""
    np = pytest.importorskip("numpy")
    text = "def f(x):\n    return x  # ünïcödé\n"
    ids = small_bpe.encode(text)
    assert small_bpe.decode(ids) == text  # byte-level BPE: decode inverts encode
    # A tensor or an array of ids decodes like the list; an iterable of texts encodes like the list.
    assert small_bpe.decode(torch.tensor(ids)) == small_bpe.decode(np.array(ids)) == text
    assert small_bpe.encode_batch(t for t in [text, "x"]) == [ids, small_bpe.encode("x")]
    assert small_bpe.decode([]) == "" and small_bpe.encode_batch([]) == []
    # Anything an index can be: numpy ints, the 0-d tensors of list(tensor) (a false refusal in
    # the branch's first version).
    assert small_bpe.decode(list(torch.tensor(ids))) == small_bpe.decode([np.int64(i) for i in ids]) == text
    v = small_bpe.vocab_size
    for call, argument, error, message in [
        (small_bpe.encode, None, TypeError, r"HFTokenizer.encode: text must be a str, got NoneType: None"),
        (small_bpe.encode, b"x", TypeError, r"HFTokenizer.encode: text must be a str, got bytes: b'x'"),
        (small_bpe.encode_batch, "abc", TypeError,
         r"HFTokenizer.encode_batch: texts must be a sequence of str \(one per document\), got str: 'abc'"),
        (small_bpe.encode_batch, ["a", 1], TypeError, r"HFTokenizer.encode_batch: texts\[1\] must be a str, got int: 1"),
        (small_bpe.decode, None, TypeError, r"HFTokenizer.decode: ids must be a sequence of token ids \(ints\), got NoneType"),
        (small_bpe.decode, "abc", TypeError, r"HFTokenizer.decode: ids must be a sequence of token ids \(ints\), got str"),
        (small_bpe.decode, [3, 1.5], TypeError, r"HFTokenizer.decode: ids\[1\] must be a token id \(an int\), got float: 1.5"),
        (small_bpe.decode, [True], TypeError, r"HFTokenizer.decode: ids\[0\] must be a token id \(an int\), got bool"),
        (small_bpe.decode, [5, -1], ValueError, rf"HFTokenizer.decode: ids\[1\] must be a token id in \[0, {v}\), got -1"),
        (small_bpe.decode, [v + 99, 5], ValueError, rf"HFTokenizer.decode: ids\[0\] must be a token id in \[0, {v}\), got {v + 99}"),
        (small_bpe.decode, np.array([v]), ValueError, rf"HFTokenizer.decode: ids\[0\] must be a token id in \[0, {v}\), got {v}"),
    ]:
        with pytest.raises(error, match="^" + message):
            call(argument)

    # TiktokenTokenizer's methods run the same checks before its backend sees anything (tiktoken
    # itself may be absent here: a backend that fails if called stands in for it).
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the backend's {name} was reached")

    tk = object.__new__(data.TiktokenTokenizer)
    tk.backend, tk.name, tk.vocab_size = Untouchable(), "tiktoken:fake", 10
    for call, argument, error, message in [
        (tk.encode, None, TypeError, r"TiktokenTokenizer.encode: text must be a str, got NoneType"),
        (tk.encode_batch, "abc", TypeError, r"TiktokenTokenizer.encode_batch: texts must be a sequence of str"),
        (tk.decode, [1, 10], ValueError, r"TiktokenTokenizer.decode: ids\[1\] must be a token id in \[0, 10\), got 10"),
        (tk.decode, ["a"], TypeError, r"TiktokenTokenizer.decode: ids\[0\] must be a token id \(an int\), got str"),
        # Review of the change: a dict was decoded (or encoded) as its keys, and a set in an order the
        # caller cannot map back; both are refused, as check_int_sequence refuses them.
        (tk.decode, {1: "x", 2: "y"}, TypeError, r"TiktokenTokenizer.decode: ids must be a sequence of token ids \(ints\), got dict"),
        (tk.decode, {1, 2}, TypeError, r"TiktokenTokenizer.decode: ids must be a sequence of token ids \(ints\), got set"),
        (tk.encode_batch, {"ab": 1}, TypeError, r"TiktokenTokenizer.encode_batch: texts must be a sequence of str .*, got dict"),
        (tk.encode_batch, {"ab", "cd"}, TypeError, r"TiktokenTokenizer.encode_batch: texts must be a sequence of str .*, got set"),
    ]:
        with pytest.raises(error, match="^" + message):
            call(argument)


def test_packed_batch_refuses_mixed_devices_negative_ids_and_more_slots_than_tokens():
    """Break-it (reliability tail). Before: labels or loss_mask on another device (meta, say) were
    accepted and failed only when a trainer copied them; a negative input id was accepted (the
    embedding reads every row); a batch of T=1 with N=4 slots was accepted, though
    check_capacities asks N <= T of every capacity pair."""
    batch = _batch_5_4_7()
    for name in ("labels", "loss_mask"):
        with pytest.raises(ValueError, match=rf"^PackedBatch.{name} must be on input_ids' device cpu, got meta$"):
            dataclasses.replace(batch, **{name: getattr(batch, name).to("meta")})
    ids = batch.input_ids.clone()
    ids[14], ids[15] = -1, -7  # rows of the third sequence
    with pytest.raises(ValueError, match=r"^PackedBatch.input_ids must be token ids >= 0 on every row \(padding included: "
                                         r"the model embeds all T rows\), got input_ids\[14\] = -1 \(2 such rows\)$"):
        dataclasses.replace(batch, input_ids=ids, labels=torch.roll(ids, -1) * batch.loss_mask)
    with pytest.raises(ValueError, match=r"^PackedBatch.cu_seqlens must describe at most T=1 sequences \(N <= T\), got N=4$"):
        PackedBatch(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.bool),
                    torch.zeros(5, dtype=torch.int32), 0, 0, 0)
    # The edge that stays legal: N = T (every slot may hold one token), and T = 0 with one slot.
    one_each = batch_from_pieces([[3], [4]], 2, 2)
    assert one_each.sequence_capacity == one_each.token_capacity == 2
    empty = PackedBatch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                        torch.zeros(0, dtype=torch.bool), torch.zeros(2, dtype=torch.int32), 0, 0, 0)
    assert empty.active_tokens == 0
