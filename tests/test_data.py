"""Tests for attn_gym_lite.data: packed batches, corpora, tokenizers and the loader in corpus order.

The references are independent: plain Python loops over the batch tensors, a byte tokenizer
whose token counts are obvious, and the documents re-tokenized one at a time.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import sysconfig
from itertools import pairwise
from pathlib import Path

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

FIXTURES = Path(__file__).parent / "fixtures"
TINY_CORPUS = FIXTURES / "tiny_corpus"
TINY_JSONL = FIXTURES / "tiny.jsonl"


def expected_pieces(documents, tokenizer, max_piece_tokens):
    """Documents of >= 2 tokens, tokenized one by one (not batched), cut into consecutive pieces."""
    pieces = []
    for document in documents:
        ids = tokenizer.encode(document)
        if len(ids) >= 2:
            pieces += [ids[i : i + max_piece_tokens] for i in range(0, len(ids), max_piece_tokens)]
    return pieces


def assert_packing(batches, pieces, token_capacity, sequence_capacity) -> None:
    """Batches hold exactly ``pieces``, in order, one per sequence, packed greedily."""
    assert batches, "the loader yielded nothing"
    for batch in batches:
        assert_batch_invariants(batch, token_capacity, sequence_capacity)
    packed = [sequence for batch in batches for sequence in sequences_of(batch)]
    assert packed == pieces
    # Greedy and in order: a batch was closed only because its successor's first piece did not
    # fit the room left, or because all N slots were used.
    for current, following in pairwise(batches):
        room = token_capacity - current.active_tokens
        assert len(sequences_of(following)[0]) > room or current.active_sequences == sequence_capacity


PARQUET_TEXTS = ["First row.", None, "Row groups of two rows make the reader stream several batches.",
                 "Ünïcödé row ✓", "", "Last row."]


@pytest.fixture(scope="session")
def parquet_path(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("parquet") / "tiny.parquet"
    table = pa.table({"text": pa.array(PARQUET_TEXTS, pa.string()), "id": list(range(len(PARQUET_TEXTS)))})
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


# PackedBatch


def _batch_5_4_7() -> PackedBatch:
    """Sequences of 5, 4 and 7 tokens in T = 16 rows, N = 3 slots: cu_seqlens [0, 5, 9, 16]."""
    return batch_from_pieces([list(range(10 * i + 1, 10 * i + 1 + n)) for i, n in enumerate([5, 4, 7])], 16, 3)


def test_batch_from_pieces_by_hand():
    batch = batch_from_pieces([[5, 6, 7], [8, 9]], 8, 3)
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert batch.labels.tolist() == [6, 7, 0, 9, 0, 0, 0, 0]
    assert batch.loss_mask.tolist() == [True, True, False, True, False, False, False, False]
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 5]
    assert (batch.active_tokens, batch.active_sequences, batch.max_seqlen) == (5, 2, 3)
    assert (batch.token_capacity, batch.sequence_capacity) == (8, 3)
    assert repr(batch) == ("PackedBatch(T=8, N=3, L=5, M=2, max_seqlen=3, input_ids=int64[8], labels=int64[8], "
                           "loss_mask=bool[8], cu_seqlens=int32[4])")
    assert_batch_invariants(batch, 8, 3)


def _with(name, rows, value):
    batch = _batch_5_4_7()
    tensor = getattr(batch, name).clone()
    tensor[rows] = value
    return {name: tensor}


WRONG_LOSS = {  # each a batch that would train on something else than it says, silently
    "L contradicts cu_seqlens": ({"active_tokens": 12}, "active_tokens"),
    "M contradicts cu_seqlens": ({"active_sequences": 1}, "active_sequences"),
    "max_seqlen below the longest": ({"max_seqlen": 3}, "max_seqlen"),
    "cu_seqlens decreasing": ({"cu_seqlens": torch.tensor([0, 9, 5, 16], dtype=torch.int32)}, "cu_seqlens"),
    "L > T": ({"cu_seqlens": torch.tensor([0, 5, 9, 17], dtype=torch.int32)}, "cu_seqlens"),
    "-100 on a counted row": (_with("labels", [1, 2], -100), "labels"),
    "loss on padding": (_with("loss_mask", [15], True) | {"cu_seqlens": torch.tensor([0, 5, 9, 15], dtype=torch.int32),
                                                         "active_tokens": 15, "max_seqlen": 6}, "loss_mask"),
    "loss on a sequence's last token": (_with("loss_mask", [4], True) | _with("labels", [4], 3), "loss_mask"),
    "labels not shifted": ({"labels": _batch_5_4_7().input_ids * _batch_5_4_7().loss_mask}, "loss_mask"),
}


@pytest.mark.parametrize("case", WRONG_LOSS)
def test_packed_batch_refuses_what_would_give_a_wrong_loss(case):
    overrides, name = WRONG_LOSS[case]
    with pytest.raises(ValueError, match=name):
        dataclasses.replace(_batch_5_4_7(), **overrides)


def test_packed_batch_takes_what_is_harmless():
    batch = _batch_5_4_7()
    # A label on a row the loss does not count is never read; a prompt mask is the caller's choice.
    relabelled = dataclasses.replace(batch, **_with("labels", [4, 8, 15], -100))
    assert relabelled.labels[4] == -100
    assert int(dataclasses.replace(batch, **_with("loss_mask", [0, 1, 2], False)).loss_mask.sum()) == 10
    # Empty sequences between the others: M counts the non-empty ones.
    gap = PackedBatch(torch.arange(8), torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.bool),
                      torch.tensor([0, 3, 3, 5, 5], dtype=torch.int32), 5, 2, 3)
    assert gap.active_sequences == sum(1 for a, b in pairwise([0, 3, 3, 5, 5]) if b > a)
    # A cu_seqlens off the CPU is not read (that would sync): its host ints are taken as they are.
    meta = {name: getattr(batch, name).to("meta") for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
    assert PackedBatch(**meta, active_tokens=12, active_sequences=1, max_seqlen=3).active_tokens == 12
    assert batch.pin_memory() is batch or batch.pin_memory().input_ids.is_pinned()


# Synthetic loaders and the padded layout


def test_synthetic_loader_shapes_schedule_and_seed():
    T, N, vocab, count = 256, 16, 1000, 6
    batches = list(packed_batch_loader(count, T, vocab, N, seed=3))
    smallest = max(N, T // 8)
    for i, batch in enumerate(batches):
        assert_batch_invariants(batch, T, N, second_half_loss=True)
        expected_L = round(T + (smallest - T) * i / (count - 1))
        assert batch.active_tokens == expected_L
        assert batch.active_sequences == max(1, round(N * expected_L / T))
        assert int(batch.input_ids.max()) < vocab
    assert (batches[0].active_tokens, batches[0].active_sequences) == (T, N)
    again, other = list(packed_batch_loader(count, T, vocab, N, seed=3)), list(packed_batch_loader(count, T, vocab, N))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, again))
    assert not all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, other))
    (single,) = packed_batch_loader(1, 64, 10, 64)
    assert (single.active_tokens, single.active_sequences, single.max_seqlen) == (64, 64, 1)


def test_fixed_count_loader_holds_M_documents_of_real_text():
    stream = torch.arange(1000, dtype=torch.int64)  # stand-in ids: every position distinct
    batches = list(fixed_count_loader(stream, 12, 256, 8, min_fill=0.25, seed=5))
    position = 0
    for batch in batches:
        assert_batch_invariants(batch, 256, 8, second_half_loss=True)
        assert batch.active_sequences == 8 and 64 <= batch.active_tokens <= 256
        window = torch.arange(position, position + batch.active_tokens) % 1000  # the next window, in order
        assert torch.equal(batch.input_ids[: batch.active_tokens], stream[window])
        position += batch.active_tokens
    fills = [b.active_tokens for b in batches]
    assert len(batches) == 12 and max(fills) - min(fills) > 64, "L must vary from batch to batch"
    as_list = next(fixed_count_loader(list(range(1000)), 1, 256, 8, min_fill=0.25, seed=5))
    assert torch.equal(as_list.input_ids, batches[0].input_ids)


def test_padded_batch_is_the_padded_layout_of_the_same_documents():
    batch = next(iter(packed_batch_loader(1, 64, 50, 4, seed=1)))
    padded = padded_batch(batch)
    width, rows = batch.max_seqlen, batch.active_sequences
    assert padded.cu_seqlens.tolist() == list(range(0, rows * width + 1, width))
    bounds = batch.cu_seqlens.tolist()
    for r in range(rows):
        start, end = bounds[r], bounds[r + 1]
        for field in ("input_ids", "labels", "loss_mask"):
            row = getattr(padded, field)[r * width : (r + 1) * width]
            assert torch.equal(row[: end - start], getattr(batch, field)[start:end])
            assert not row[end - start :].any()  # padding: id 0, label 0, no loss
    assert int(padded.loss_mask.sum()) == int(batch.loss_mask.sum())


# Corpora


def test_text_files_are_read_sorted_without_a_byte_order_mark(tmp_path):
    names = ["a.txt", "b.txt", "nested/c.txt"]
    assert list(text_files(TINY_CORPUS)) == [(TINY_CORPUS / name).read_text(encoding="utf-8") for name in names]
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    assert list(text_files(tmp_path)) == ["hello"]


def test_jsonl_texts_skip_blank_lines_nulls_and_a_byte_order_mark(tmp_path):
    lines = [line for line in TINY_JSONL.read_text(encoding="utf-8").splitlines() if line.strip()]
    expected = [json.loads(line)["text"] for line in lines if json.loads(line)["text"] is not None]
    assert len(expected) == 3 and list(jsonl_texts(TINY_JSONL)) == expected
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + '{"text": "caf\u00e9"}\n{"text": "b"}\n'.encode())
    assert list(jsonl_texts(tmp_path / "bom.jsonl")) == ["caf\u00e9", "b"]


def test_parquet_texts_stream_plain_and_dictionary_columns(parquet_path, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert list(parquet_texts(parquet_path)) == [text for text in PARQUET_TEXTS if text is not None]
    texts = ["a cat", None, "a dog", "a cat"]
    for values_type in (pa.string(), pa.large_string()):  # pandas' categorical: dictionary-encoded
        path = tmp_path / f"categorical_{values_type}.parquet"
        pq.write_table(pa.table({"text": pa.array(texts, values_type).dictionary_encode()}), path, row_group_size=2)
        assert list(parquet_texts(path)) == ["a cat", "a dog", "a cat"]


def test_python_stdlib_corpus_is_real_source():
    documents = list(python_stdlib_corpus())
    assert len(documents) > 300 and all(document.strip() for document in documents)
    assert sum("def " in document for document in documents) > 200
    assert documents == list(python_stdlib_corpus())  # deterministic order
    assert list(python_stdlib_corpus(limit=5)) == documents[:5]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    contents = set(documents)
    assert (stdlib / "os.py").read_text(encoding="utf-8") in contents
    tests = [path for path in sorted((stdlib / "test").glob("test_*.py"))[:20] if path.stat().st_size > 2000]
    assert not any(path.read_bytes().decode("utf-8", "replace") in contents for path in tests)


# Tokenizers

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
    assert cached.is_file() and 257 <= small_bpe.vocab_size <= 512
    for text in ROUND_TRIP_TEXTS:
        ids = small_bpe.encode(text)
        assert all(0 <= token < small_bpe.vocab_size for token in ids)
        assert small_bpe.decode(ids) == text
    assert small_bpe.encode_batch(ROUND_TRIP_TEXTS) == [small_bpe.encode(t) for t in ROUND_TRIP_TEXTS]
    source = next(python_stdlib_corpus())
    assert len(small_bpe.encode(source)) < 0.6 * len(source.encode("utf-8"))  # BPE merges shorten code
    # A second load reads the cache instead of training; loading the file by path is the same tokenizer.
    monkeypatch.setenv("ATTN_GYM_LITE_CACHE", str(small_cache))
    monkeypatch.setattr(data.tokenizer, "_train_stdlib_bpe", lambda *args: pytest.fail("retrained"))
    again = load_tokenizer(vocab_size=512, max_training_bytes=100_000)
    assert again.encode(ROUND_TRIP_TEXTS[2]) == small_bpe.encode(ROUND_TRIP_TEXTS[2])
    assert load_tokenizer(cached).encode(source) == small_bpe.encode(source)


def test_tiktoken_spec_loads_an_encoding(monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    local = tiktoken.Encoding(name="local-bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                              special_tokens={})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: local)  # stands in for a downloaded one
    tokenizer = load_tokenizer("tiktoken:local-bytes")
    assert isinstance(tokenizer, Tokenizer)
    assert (tokenizer.name, tokenizer.vocab_size) == ("tiktoken:local-bytes", 256)
    text = ROUND_TRIP_TEXTS[2]
    assert tokenizer.encode(text) == list(text.encode("utf-8"))  # special text stays ordinary
    assert tokenizer.encode_batch([text, "ab"]) == [list(text.encode("utf-8")), [97, 98]]
    assert tokenizer.decode(tokenizer.encode(text)) == text


# The loader on real text, in corpus order (shuffle_buffer=1, in-order packing)


def in_order(token_capacity, sequence_capacity, **kwargs) -> list[PackedBatch]:
    """Every batch of one pass of PackedLoader that keeps the corpus order, packed in order."""
    kwargs = {"policy": InOrder(), "shuffle_buffer": 1, "prefetch": 0} | kwargs
    return list(PackedLoader(token_capacity, sequence_capacity, **kwargs))


def test_loader_on_fixture_corpus_tokenizes_as_one_document_at_a_time(small_bpe, parquet_path):
    documents = [*text_files(TINY_CORPUS), *jsonl_texts(TINY_JSONL), *parquet_texts(parquet_path)]
    T, N, longest = 32, 4, 12
    batches = in_order(T, N, corpus=documents, tokenizer=small_bpe, max_piece_tokens=longest)
    pieces = expected_pieces(documents, small_bpe, longest)
    assert_packing(batches, pieces, T, N)
    assert max(map(len, pieces)) == longest  # some documents were split
    assert any(batch.active_sequences > 1 for batch in batches)  # and some packed together


def test_loader_on_stdlib_with_tokenizer_path(small_bpe, small_cache):
    documents = list(python_stdlib_corpus(limit=12))
    batches = in_order(1024, 8, corpus=documents, tokenizer=str(small_cache / small_bpe.name / "tokenizer.json"))
    assert_packing(batches, expected_pieces(documents, small_bpe, 1024), 1024, 8)


def test_loader_splits_long_documents_exactly():
    batches = in_order(16, 4, corpus=["a" * 25, "b"], tokenizer=ByteTokenizer(), max_piece_tokens=10)
    # Pieces of 10, 10, 5 tokens; the second 10 does not fit next to the first (10 + 10 > 16); "b"
    # has no target and gives no piece.
    assert [batch.cu_seqlens.tolist() for batch in batches] == [[0, 10, 10, 10, 10], [0, 10, 15, 15, 15]]
    assert [(b.active_tokens, b.active_sequences, b.max_seqlen) for b in batches] == [(10, 1, 10), (15, 2, 10)]
    assert batches[1].loss_mask.tolist() == [True] * 9 + [False] + [True] * 4 + [False] * 2


@pytest.mark.parametrize("seed", range(24))
def test_loader_in_corpus_order_random_cases(seed):
    """Random corpora and capacities, including empty documents and T = 1."""
    rng = random.Random(seed)
    token_capacity = rng.randint(1, 48)
    sequence_capacity = rng.randint(1, token_capacity)
    longest = rng.randint(1, token_capacity)
    alphabet = "ab \né日🚀"  # 1- to 4-byte UTF-8 characters
    documents = ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(rng.randint(1, 12))]
    tokenizer = ByteTokenizer()
    batches = in_order(token_capacity, sequence_capacity, corpus=documents, tokenizer=tokenizer,
                       max_piece_tokens=longest)
    pieces = expected_pieces(documents, tokenizer, longest)
    if pieces:
        assert_packing(batches, pieces, token_capacity, sequence_capacity)
    else:
        assert batches == []
