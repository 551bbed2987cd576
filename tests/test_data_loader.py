"""Tests for attn_gym_lite.data.PackedLoader: batches, determinism, save/restore, prefetch.

The reference for "no token lost or duplicated" is every document tokenized on its own and cut
by the boundary rule: the loader's sequences, over a whole run, must be exactly those pieces
(each ``epochs`` times), whatever the shuffle and the policy did to their order.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from itertools import islice

import pytest
import torch
from helpers import ByteTokenizer, assert_batch_invariants, sequences_of

from attn_gym_lite.data import (
    BestFit,
    FirstFit,
    InOrder,
    PackedBatch,
    PackedLoader,
    batch_from_pieces,
    jsonl_texts,
    segment,
)

TENSOR_FIELDS = ("input_ids", "labels", "loss_mask", "cu_seqlens")


def random_corpus(seed: int, count: int = 40, longest: int = 90) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefgh \n", k=rng.randint(0, longest))) for _ in range(count)]


def expected_pieces(corpus, size, minimum=2):
    tokenizer = ByteTokenizer()
    return [
        tuple(piece)
        for text in corpus
        if len(ids := tokenizer.encode(text)) >= minimum
        for piece in segment(ids, size)
    ]


def same_batches(first, second) -> bool:
    return len(first) == len(second) and all(
        all(torch.equal(getattr(a, f), getattr(b, f)) for f in TENSOR_FIELDS)
        and (a.active_tokens, a.active_sequences, a.max_seqlen)
        == (b.active_tokens, b.active_sequences, b.max_seqlen)
        for a, b in zip(first, second)
    )


def make(corpus, **overrides) -> PackedLoader:
    arguments = dict(corpus=corpus, tokenizer=ByteTokenizer(), max_piece_tokens=24, prefetch=0)
    return PackedLoader(64, **(arguments | overrides))


LOADER_CASES = {
    "best-fit": {},
    "first-fit, 2 epochs": {"policy": FirstFit(4), "epochs": 2},
    "in order, N cap": {"policy": InOrder(), "sequence_capacity": 3, "shuffle_buffer": 1},
    "best-fit B=1, prefetch": {"policy": BestFit(1), "prefetch": 2},
    "best-fit, 3 epochs, prefetch": {"policy": BestFit(6), "epochs": 3, "prefetch": 1},
}


@pytest.mark.parametrize("case", LOADER_CASES, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_loader_batches_hold_every_piece_once(case, seed):
    corpus = random_corpus(seed)
    loader = make(corpus, seed=seed, **LOADER_CASES[case])
    batches = list(loader)
    N = loader.sequence_capacity
    assert N == loader.policy.sequence_bound(64, LOADER_CASES[case].get("sequence_capacity"))
    for batch in batches:
        assert_batch_invariants(batch, 64, N)
    packed = sorted(tuple(s) for b in batches for s in sequences_of(b))
    epochs = LOADER_CASES[case].get("epochs", 1)
    assert packed == sorted(expected_pieces(corpus, 24) * epochs)


@pytest.mark.parametrize(
    ("name", "corpus", "kwargs", "pieces"),
    [
        ("all longer than T", ["x" * 150, "y" * 64, "z" * 129], {}, [64, 64, 22, 64, 64, 64, 1]),
        ("all length 1", ["a"] * 70, {"min_document_tokens": 1}, [1] * 70),
        ("exactly T", ["q" * 64] * 5, {}, [64] * 5),
        ("empty documents", ["", "ab", "", "", "cde", ""], {"min_document_tokens": 1}, [2, 3]),
    ],
)
@pytest.mark.parametrize("policy", [InOrder(), FirstFit(8), BestFit(8)], ids=lambda p: p.label)
def test_loader_on_adversarial_corpora(name, corpus, kwargs, pieces, policy):
    loader = PackedLoader(64, corpus=corpus, tokenizer=ByteTokenizer(), policy=policy, prefetch=0, **kwargs)
    batches = list(loader)
    for batch in batches:
        assert_batch_invariants(batch, 64, loader.sequence_capacity)
        assert batch.active_sequences <= policy.sequence_bound(64)
    assert sorted(len(s) for b in batches for s in sequences_of(b)) == sorted(pieces), name
    assert sum(b.active_tokens for b in batches) == sum(len(d) for d in corpus if len(d) >= kwargs.get("min_document_tokens", 2))


def test_loader_is_deterministic_for_a_seed_and_the_seed_matters():
    corpus = random_corpus(3, count=60)
    first = list(make(corpus, seed=7, shuffle_buffer=16))
    assert same_batches(first, list(make(corpus, seed=7, shuffle_buffer=16, prefetch=3)))
    assert not same_batches(first, list(make(corpus, seed=8, shuffle_buffer=16)))
    # shuffle_buffer=1 keeps corpus order: the seed has no effect, and in order reproduces
    # the plain in-order packing of the pieces.
    in_order = [make(corpus, seed=s, shuffle_buffer=1, policy=InOrder(), sequence_capacity=64) for s in (1, 2)]
    runs = [list(loader) for loader in in_order]
    assert same_batches(*runs)
    assert [tuple(s) for b in runs[0] for s in sequences_of(b)] == expected_pieces(corpus, 24)


@pytest.mark.parametrize("case", LOADER_CASES, ids=str)
def test_save_and_restore_resumes_on_the_identical_next_batch(case):
    corpus = random_corpus(5, count=30)
    settings = dict(seed=11, shuffle_buffer=7) | LOADER_CASES[case]
    reference = list(make(corpus, **settings))
    assert len(reference) > 5
    for cut in range(len(reference) + 1):
        loader = make(corpus, **settings)
        seen = list(islice(loader, cut))
        state = json.loads(json.dumps(loader.state_dict()))  # plain data, survives JSON
        assert state["batches"] == cut
        resumed = make(corpus, **settings)
        resumed.load_state_dict(state)
        assert same_batches(seen + list(resumed), reference), f"resumed after batch {cut}"


def test_state_dict_is_a_copy_and_a_finished_pass_starts_over():
    corpus = random_corpus(2, count=12)
    loader = make(corpus)
    first = list(loader)
    state = loader.state_dict()
    state["pending"].append([0, 0, 1])  # mutating the copy does not touch the loader
    assert loader.state_dict()["batches"] == 0 and loader.state_dict()["pending"] == []
    assert same_batches(first, list(loader))


def test_restore_reads_a_corpus_function_again(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in random_corpus(9, count=25)))
    corpus = functools.partial(jsonl_texts, path)
    reference = list(make(corpus, seed=2))
    loader = make(corpus, seed=2)
    seen = list(islice(loader, 4))
    resumed = make(corpus, seed=2)
    resumed.load_state_dict(loader.state_dict())
    assert same_batches(seen + list(resumed), reference)


def test_pre_tokenized_documents_skip_the_tokenizer():
    corpus = random_corpus(8, count=30)
    tokenizer = ByteTokenizer()
    as_ids = [tokenizer.encode(text) for text in corpus]
    as_ids[3] = tuple(as_ids[3])
    reference = list(make(corpus, seed=4, shuffle_buffer=9))
    assert same_batches(list(make(as_ids, seed=4, shuffle_buffer=9)), reference)
    loader = make(as_ids, seed=4, shuffle_buffer=9)
    seen = list(islice(loader, 3))
    resumed = make(as_ids, seed=4, shuffle_buffer=9)
    resumed.load_state_dict(loader.state_dict())
    assert same_batches(seen + list(resumed), reference)


def test_load_state_dict_rejects_mismatches():
    corpus = random_corpus(4, count=20)
    loader = make(corpus)
    list(islice(loader, 2))
    state = loader.state_dict()
    with pytest.raises(ValueError, match=r"saved with policy='best-fit B=32', but this loader has policy='first-fit B=32'"):
        make(corpus, policy=FirstFit(32)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with seed=0, but this loader has seed=1"):
        make(corpus, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state is missing keys \['rng'\]"):
        make(corpus).load_state_dict({k: v for k, v in state.items() if k != "rng"})
    with pytest.raises(TypeError, match=r"state must be a dict from state_dict\(\), got list"):
        make(corpus).load_state_dict([])
    # A position past the corpus's end fails at load time; a state naming pending documents the
    # corpus does not have fails when iteration starts (they are tokenized then).
    with pytest.raises(ValueError, match=r"state\['source_position'\] must be at most the corpus's 3 documents, got 20"):
        make(corpus[:3]).load_state_dict(state)
    other = make(corpus[:3])
    other.load_state_dict(state | {"pending": [[15, 0, 4]], "source_position": 0, "shuffle": [],
                                   "corpus_digest": other.state_dict()["corpus_digest"]})
    with pytest.raises(ValueError, match=r"refers to documents \[15\] but the corpus has only 3"):
        next(iter(other))


def test_a_state_restored_on_another_corpus_or_tokenizer_is_refused_by_name():
    """Before: a state restored on a corpus with the same number of documents and lengths but
    other (edited, reordered) documents, or with another tokenizer under the same name, loaded
    and resumed silently at the wrong place (other documents, other token ids)."""
    corpus = random_corpus(4, count=30)
    loader = make(corpus, shuffle_buffer=7)
    seen = list(islice(loader, 2))
    state = json.loads(json.dumps(loader.state_dict()))
    assert seen and state["source_position"] > 0
    # Same lengths, other text: every pending token range still fits, only the digest tells.
    edited = [text.translate(str.maketrans("abcdefgh", "ijklmnop")) for text in corpus]
    swapped = [corpus[1], corpus[0], *corpus[2:]]
    for other in (edited, swapped):
        with pytest.raises(ValueError, match=r"state\['corpus_digest'\] must match the corpus's first 30 documents"):
            make(other, shuffle_buffer=7).load_state_dict(state)
    with pytest.raises(TypeError, match=r"state\['corpus_digest'\] must be a 32-character hex digest"):
        make(corpus, shuffle_buffer=7).load_state_dict(state | {"corpus_digest": 5})

    class ShiftedBytes(ByteTokenizer):  # the same name and vocabulary, other ids
        def encode(self, text):
            return [(token + 1) % 256 for token in super().encode(text)]

    with pytest.raises(ValueError, match=r"saved with tokenizer_fingerprint='vocab256-[0-9a-f]+', but this loader has"):
        make(corpus, shuffle_buffer=7, tokenizer=ShiftedBytes()).load_state_dict(state)
    # The corpus it was saved on still resumes on the identical next batch.
    resumed = make(corpus, shuffle_buffer=7)
    resumed.load_state_dict(state)
    assert same_batches(seen + list(resumed), list(make(corpus, shuffle_buffer=7)))


def test_load_state_dict_checks_every_field():
    """Before: load_state_dict checked only the keys and the config: source_position=-5 failed
    while iterating ("Indices for islice() must be None or an integer"), batches='x' with a str
    concatenation error, and epoch=7 with epochs=1 or source_position=10**6 were accepted."""
    corpus = random_corpus(4, count=20)
    loader = make(corpus, epochs=1)
    list(islice(loader, 2))
    state = loader.state_dict()
    assert state["source_position"] == 20 and state["epoch"] == 0
    cases = [
        ({"source_position": -5}, ValueError, r"state\['source_position'\] must be an int in \[0, 9223372036854775807\], got -5"),
        ({"source_position": 10**6}, ValueError,
         r"state\['source_position'\] must be at most the corpus's 20 documents, got 1000000: "
         r"was the state saved with another corpus\?"),
        ({"source_position": 2.0}, TypeError, r"state\['source_position'\] must be an int in \[0, 9223372036854775807\], got 2.0"),
        ({"batches": "x"}, TypeError, r"state\['batches'\] must be an int >= 0, got 'x'"),
        ({"epoch": 7}, ValueError, r"state\['epoch'\] must be below this loader's epochs = 1 \(epochs count from 0\), got 7"),
        ({"epoch": True}, TypeError, r"state\['epoch'\] must be an int >= 0, got True"),
        ({"config": None}, TypeError, r"state\['config'\] must be a dict of the loader's arguments, got NoneType"),
        ({"shuffle": "x"}, TypeError, r"state\['shuffle'\] must be a list, got str: 'x'"),
        ({"shuffle": [99]}, ValueError, r"state\['shuffle'\]\[0\] must be an int in \[0, 19\], got 99"),
        ({"shuffle": [3, 3]}, ValueError, r"state\['shuffle'\] must hold distinct document indices, got \[3, 3\]"),
        ({"shuffle": [1], "source_position": 0}, ValueError,
         r"state\['shuffle'\] must be empty when state\['source_position'\] is 0"),
        ({"pending": [[1, 5]]}, TypeError, r"state\['pending'\]\[0\] must be a \[document, start, stop\] list of 3 ints, got \[1, 5\]"),
        ({"pending": [[1, 5, 3]]}, ValueError, r"state\['pending'\]\[0\]\[2\] \(stop\) must be an int in \[6, 29\], got 3"),
        ({"pending": [[-1, 0, 3]]}, ValueError, r"state\['pending'\]\[0\]\[0\] \(document\) must be an int >= 0, got -1"),
        ({"rng": 5}, ValueError, r"state\['rng'\] must be a random.Random state as state_dict\(\) writes it"),
        # Reliability tail, round 2. Before: a negative word raised a bare OverflowError, words of
        # 2**32 or more were truncated silently, version 2 and a string gauss_next were taken; a
        # source_position past sys.maxsize failed inside islice; an extra key (a sharded loader's
        # "shard") was ignored.
        ({"rng": [3, [-1] + state["rng"][1][1:], None]}, ValueError,
         r"internal state entry 0 must be an int in \[0, 4294967296\), got -1"),
        ({"rng": [3, state["rng"][1][:3] + [2**33] + state["rng"][1][4:], None]}, ValueError,
         r"internal state entry 3 must be an int in \[0, 4294967296\), got 8589934592"),
        ({"rng": [2, state["rng"][1], None]}, ValueError, r"version must be 3 \(random.Random's\), got 2"),
        ({"rng": [3, state["rng"][1], "x"]}, ValueError, r"gauss_next must be None or a finite float, got 'x'"),
        ({"source_position": 2**63}, ValueError,
         r"state\['source_position'\] must be an int in \[0, 9223372036854775807\], got 9223372036854775808"),
        ({"shard": {"rank": 0, "world_size": 1}}, ValueError,
         r"state has keys this loader does not read \['shard'\] \(a ShardedPackedLoader's state: .*\); expected"),
        ({"note": "mine"}, ValueError, r"state has keys this loader does not read \['note'\]; expected"),
    ]
    for change, error, match in cases:
        with pytest.raises(error, match=match):
            make(corpus, epochs=1).load_state_dict(state | change)
    # The state itself (through JSON) still loads and resumes; epochs=None takes any epoch.
    resumed = make(corpus, epochs=1)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert len(list(resumed)) > 0
    make(corpus, epochs=None).load_state_dict(state | {"config": state["config"] | {"epochs": None}, "epoch": 7})


def test_worker_errors_reach_the_consumer():
    def corpus():
        yield "abcdef" * 20
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(make(corpus, prefetch=2))
    with pytest.raises(TypeError, match=r"corpus\[0\] must be a document string or a list/tuple of token ids, got int"):
        list(make([3, "text"], shuffle_buffer=1, prefetch=2))


def test_stopping_early_stops_the_prefetch_thread():
    before = set(threading.enumerate())  # other tests' loaders may still hold threads
    loader = make(random_corpus(6, count=200), prefetch=2)
    iterator = iter(loader)
    next(iterator)
    ours = [t for t in threading.enumerate() if t not in before and t.name == "PackedLoader-prefetch"]
    assert len(ours) == 1 and ours[0].is_alive()
    iterator.close()
    ours[0].join(timeout=10)  # close() stops the worker; give it time to notice
    assert not ours[0].is_alive()
    assert loader.state_dict()["batches"] == 1  # the position is the consumer's, not the worker's


@pytest.mark.gpu
def test_batches_are_pinned_with_cuda():
    batch = next(iter(make(random_corpus(1), prefetch=1)))
    assert all(getattr(batch, f).is_pinned() for f in TENSOR_FIELDS)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"corpus": iter(["a b"])}, TypeError, r"corpus must be re-readable .* got list_iterator"),
        ({"corpus": "one document"}, TypeError, r"corpus must be re-readable .* got str"),
        ({"corpus": 5}, TypeError, r"corpus must be re-readable .* got int"),
        ({"token_capacity": 0}, ValueError, r"token_capacity must be an int >= 1, got 0"),
        ({"policy": "best-fit"}, TypeError, r"policy must be a PackingPolicy .* got str"),
        ({"sequence_capacity": 65}, ValueError, r"sequence_capacity must be an int in \[1, 64\], got 65"),
        ({"max_piece_tokens": 65}, ValueError, r"max_piece_tokens must be an int in \[1, 64\], got 65"),
        ({"max_piece_tokens": 0}, ValueError, r"max_piece_tokens must be an int in \[1, 64\], got 0"),
        ({"min_document_tokens": 0}, ValueError, r"min_document_tokens must be an int >= 1, got 0"),
        ({"shuffle_buffer": 0}, ValueError, r"shuffle_buffer must be an int >= 1, got 0"),
        ({"epochs": 0}, ValueError, r"epochs must be an int >= 1, got 0"),
        ({"prefetch": -1}, ValueError, r"prefetch must be an int >= 0, got -1"),
        ({"pin_memory": 1}, TypeError, r"pin_memory must be a bool, got int"),
        ({"tokenizer": object()}, TypeError, r"tokenizer must have name, vocab_size"),
        ({"tokenizer": "missing/tokenizer.json"}, FileNotFoundError, r"spec='missing/tokenizer.json'"),
    ],
)
def test_loader_rejects_bad_arguments(kwargs, error, match):
    arguments = {"token_capacity": 64, "corpus": ["a b"], "tokenizer": ByteTokenizer()} | kwargs
    with pytest.raises(error, match=match):
        PackedLoader(**arguments)


def test_endless_epochs_and_a_corpus_without_pieces_ends():
    loader = make(["abcdefgh"] * 3, epochs=None, policy=InOrder(), sequence_capacity=8)
    assert len(list(islice(loader, 10))) == 10  # epochs=None repeats the corpus
    # Nothing to pack: stops instead of spinning, and says so instead of yielding no batch.
    with pytest.raises(ValueError, match="corpus yielded no document of at least min_document_tokens = 2 tokens"):
        list(make(["a", ""], epochs=None))
    with pytest.raises(ValueError, match="corpus yielded no document of at least min_document_tokens = 1 tokens"):
        list(make(["", "", ""], min_document_tokens=1))
    with pytest.raises(ValueError, match="corpus must hold at least one document, got an empty sequence"):
        make([])


def test_batch_from_pieces_by_hand_and_errors():
    batch = batch_from_pieces([[5, 6, 7], [8, 9]], 8, 3)
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert batch.labels.tolist() == [6, 7, 0, 9, 0, 0, 0, 0]
    assert batch.loss_mask.tolist() == [True, True, False, True, False, False, False, False]
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 5]
    assert (batch.active_tokens, batch.active_sequences, batch.max_seqlen) == (5, 2, 3)
    with pytest.raises(ValueError, match=r"at most token_capacity=4 tokens, got 5"):
        batch_from_pieces([[1, 2, 3], [4, 5]], 4, 2)
    with pytest.raises(ValueError, match=r"1..sequence_capacity=1 sequences, got 2"):
        batch_from_pieces([[1], [2]], 4, 1)
    with pytest.raises(ValueError, match=r"must be non-empty, got lengths \[1, 0\]"):
        batch_from_pieces([[1], []], 4, 2)


def test_batch_from_pieces_names_an_id_that_is_not_a_token():
    """Before: np.fromiter truncated 1.5 to 1, kept -1 and True as ids, and a string piece or a
    huge id failed with numpy's bare "invalid literal" / OverflowError."""
    cases = [
        ([[5, 1.5, 7]], TypeError, r"pieces\[0\]\[1\] must be an int in \[0, 9223372036854775807\], got 1.5"),
        ([[5], [-1, 2]], ValueError, r"pieces\[1\]\[0\] must be an int in \[0, 9223372036854775807\], got -1"),
        ([[True, 2]], TypeError, r"pieces\[0\]\[0\] must be an int .*got True"),
        ([[2**70]], ValueError, r"pieces\[0\]\[0\] must be an int .*got 1180591620717411303424"),
        ([torch.tensor([1.5, 2.0])], TypeError, r"pieces\[0\] must be a sequence of ints, got a torch.float32 tensor"),
        (["abc"], TypeError, r"pieces\[0\] must be a sequence of token ids \(ints\), got str: 'abc'"),
        (5, TypeError, r"pieces must be a sequence of token-id sequences, got int"),
        # Reliability tail. Before: "len() of a 0-d tensor", "object of type 'numpy.int64' has no
        # len()", and a bytearray taken as ids while bytes was refused.
        ([torch.tensor(3)], TypeError, r"^pieces\[0\] must be a sequence of token ids \(ints\), got Tensor: tensor\(3\)$"),
        ([7, 8], TypeError, r"^pieces\[0\] must be a sequence of token ids \(ints\), got int: 7$"),
        ([bytearray(b"ab")], TypeError, r"^pieces\[0\] must be a sequence of token ids \(ints\), got bytearray"),
    ]
    for pieces, error, match in cases:
        with pytest.raises(error, match=match):
            batch_from_pieces(pieces, 8, 2)
    # Integer tensors and numpy ids are ids.
    import numpy as np

    batch = batch_from_pieces([torch.tensor([5, 6]), [np.int64(7), 8]], 8, 2)
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 0, 0, 0, 0]



def test_a_batch_repr_is_its_sizes_dtypes_and_shapes():
    """Before: repr(PackedBatch) printed every tensor in full, 11,152 characters at T = 512."""
    pieces = [[1] * 97, [2] * 100, [3] * 50, [4] * 80, [5] * 104]
    batch = batch_from_pieces(pieces, 512, 8)
    assert repr(batch) == str(batch) == (
        "PackedBatch(T=512, N=8, L=431, M=5, max_seqlen=104, input_ids=int64[512], labels=int64[512], "
        "loss_mask=bool[512], cu_seqlens=int32[9])"
    )
    # A tensor off the CPU shows its device (a meta batch stands for a CUDA one: no values read).
    meta = PackedBatch(*(getattr(batch, f).to("meta") for f in TENSOR_FIELDS),
                       active_tokens=431, active_sequences=5, max_seqlen=104)
    assert repr(meta).endswith("input_ids=int64[512]@meta, labels=int64[512]@meta, loss_mask=bool[512]@meta, "
                               "cu_seqlens=int32[9]@meta)")

@pytest.mark.parametrize(("stray", "error", "match"), [
    (99999, ValueError, r"must be a token id in \[0, 256\) \(the vocabulary of 'bytes'\), got 99999"),
    (-1, ValueError, r"must be a token id in \[0, 256\) \(the vocabulary of 'bytes'\), got -1"),
    (256, ValueError, r"must be a token id in \[0, 256\) \(the vocabulary of 'bytes'\), got 256"),
    (2.0, TypeError, r"must be a token id \(an int\), got float: 2.0"),
    (True, TypeError, r"must be a token id \(an int\), got bool: True"),
])
def test_pre_tokenized_ids_outside_the_vocabulary_are_named_where_they_are_read(stray, error, match):
    """Before: PackedLoader(256, corpus=[[1, 2, 99999, 4]] * 50, tokenizer=...) packed the id, and
    the model failed late with torch's bare IndexError in the embedding."""
    corpus = [[1, 2, 3, 4]] * 49 + [[1, 2, stray, 4]]
    loader = PackedLoader(64, corpus=corpus, tokenizer=ByteTokenizer(), prefetch=0)
    # A value out of range says how to fix it: the tokenizer the ids came from bounds them.
    hint = r": pass the tokenizer whose ids these are as tokenizer= \(its vocab_size bounds the ids\)" if error is ValueError else ""
    with pytest.raises(error, match=r"^corpus\[49\]\[2\] " + match + hint + "$"):
        list(islice(iter(loader), 10))
    # The largest id the vocabulary has is a token like any other.
    good = PackedLoader(64, corpus=[[1, 2, 255, 4]] * 50, tokenizer=ByteTokenizer(), prefetch=0)
    batch = next(iter(good))
    assert 255 in batch.input_ids[: batch.active_tokens].tolist()


def test_a_program_that_leaves_prefetching_loaders_unfinished_exits_cleanly():
    """A script that stops taking batches (``zip(loader, range(n))``, ``epochs=None``) and ends
    without closing its iterators must still exit with code 0: the workers stop at exit instead of
    being in torch while the interpreter finalizes (which aborted the process, code 134)."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent("""
        from attn_gym_lite.data import PackedLoader

        class Bytes:
            name, vocab_size = "bytes", 256
            def encode(self, text): return list(text.encode())
            def encode_batch(self, texts): return [self.encode(t) for t in texts]
            def decode(self, ids): return bytes(ids).decode()

        documents = [[(7 * i + j) % 250 for j in range(5 + i % 60)] for i in range(400)]
        iterators = []
        for seed in range(3):
            iterator = iter(PackedLoader(128, corpus=documents, tokenizer=Bytes(), seed=seed, epochs=None, prefetch=2))
            next(iterator)
            iterators.append(iterator)  # never finished, never closed
        print("trained")
    """)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    for _ in range(3):  # the abort was a race: most runs, not all
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (0, "trained"), done.stderr[-2000:]


def test_a_custom_tokenizers_output_and_a_corpus_functions_result_are_checked():
    """Break-it (reliability tail). Before: a custom tokenizer's float ids were truncated into the
    batch (1.7 -> 1) and its negative or out-of-vocabulary ids went in as they were; an
    encode_batch returning too few lists raised "generator raised StopIteration"; vocab_size=None
    failed inside a comparison; a corpus function returning a string gave one document per
    character, one returning None failed at the first batch with a bare error."""

    def tokenizer(make_ids, **members):  # a ByteTokenizer whose encode_batch is replaced
        return type("Custom", (ByteTokenizer,), {"encode_batch": lambda self, texts: make_ids(texts), **members})()

    good = PackedLoader(32, 4, corpus=["abc", "de"], tokenizer=ByteTokenizer(), prefetch=0)
    assert sorted(sequences_of(next(iter(good)))) == [[97, 98, 99], [100, 101]]  # bytes of the texts
    corpus = ["abc", "de"]
    for make_ids, error, message in [
        (lambda texts: [[1.7, 2]] * len(texts), TypeError,
         r"tokenizer 'bytes': encode_batch gave corpus\[\d\] a token id that is not an int at position 0: float 1.7"),
        (lambda texts: [[5, -1]] * len(texts), ValueError,
         r"tokenizer 'bytes': encode_batch gave corpus\[\d\] the id -1 at position 1, outside its vocabulary \[0, 256\)"),
        (lambda texts: [[256]] * len(texts), ValueError,
         r"tokenizer .bytes.: encode_batch gave corpus\[\d\] the id 256 at position 0, outside its vocabulary \[0, 256\)"),
        (lambda texts: [[True]] * len(texts), TypeError,
         r"tokenizer .bytes.: encode_batch gave corpus\[\d\] a token id that is not an int at position 0: bool True"),
        (lambda texts: [[1]] * (len(texts) - 1), ValueError,
         r"tokenizer 'bytes': encode_batch must return one token-id list per text, got 1 for 2 texts \(corpus\[\d\], corpus\[\d\]\)"),
        (lambda texts: None, TypeError, r"tokenizer 'bytes': encode_batch must return a list of token-id lists, got NoneType"),
        (lambda texts: ["ab"] * len(texts), TypeError, r"tokenizer .bytes.: encode_batch gave corpus\[\d\] str, not a list of token ids"),
    ]:
        # The fingerprint probe (one text) comes first: a tokenizer that fails it fails at the call.
        custom = tokenizer(lambda texts, make_ids=make_ids: [[1]] if texts[0].startswith("def probe") else make_ids(texts))
        loader = PackedLoader(32, 4, corpus=corpus, tokenizer=custom, prefetch=0)
        with pytest.raises(error, match="^" + message):
            next(iter(loader))
    # A 1-D array or tensor of ids per text is a list of ids (a false refusal in the branch's
    # first version): the same batches as lists.
    np = pytest.importorskip("numpy")
    for convert in (np.array, torch.tensor):
        arrays = tokenizer(lambda texts, convert=convert: [convert(list(t.encode("utf-8"))) for t in texts])
        loader = PackedLoader(32, 4, corpus=["abc", "de"], tokenizer=arrays, prefetch=0)
        assert sorted(sequences_of(next(iter(loader)))) == [[97, 98, 99], [100, 101]]
    for members, error, message in [
        ({"vocab_size": None}, TypeError, r"tokenizer.vocab_size must be an int >= 1, got None"),
        ({"vocab_size": True}, TypeError, r"tokenizer.vocab_size must be an int >= 1, got True"),
        ({"vocab_size": 0}, ValueError, r"tokenizer.vocab_size must be an int >= 1, got 0"),
        ({"name": 5}, TypeError, r"tokenizer.name must be a str, got int: 5"),
    ]:
        with pytest.raises(error, match="^" + message):
            PackedLoader(32, 4, corpus=corpus, tokenizer=tokenizer(lambda texts: [[1]] * len(texts), **members))

    for result, message in [
        ("hello world", r"corpus\(\) must return an iterable of documents, got a str \('hello world'\), which would be one "
                        r"document per character: return \[text\]"),
        (None, r"corpus\(\) must return an iterable of documents, got NoneType"),
        (5, r"corpus\(\) must return an iterable of documents, got int"),
    ]:
        loader = PackedLoader(32, 4, corpus=lambda result=result: result, tokenizer=ByteTokenizer(), prefetch=0)
        with pytest.raises(TypeError, match="^" + message):
            next(iter(loader))
    with pytest.raises(TypeError, match=r"^corpus must be callable with no arguments .*which needs some"):
        PackedLoader(32, 4, corpus=lambda path: [path], tokenizer=ByteTokenizer())
    # The same rule where a corpus function is sharded (the message, the function's result).
    from attn_gym_lite.data.sharding import shard_corpus
    with pytest.raises(TypeError, match=r"^corpus\(\) must return an iterable of documents, got a str"):
        list(shard_corpus(lambda: "text", 0, 2)())
    assert list(shard_corpus(lambda: ["a", "b", "c"], 1, 2)()) == ["b"]


def test_a_restored_state_is_refused_when_pending_documents_changed_and_a_live_iterator_is_superseded():
    """Reliability tail, round 2. Before: (1) after an epoch boundary the state's pending pieces
    may come from documents past source_position, which corpus_digest does not cover; reversing
    those documents (same lengths) between saving and restoring went unnoticed and the resumed
    stream used the new tokens. (2) load_state_dict during a live iteration was silently lost:
    the old iterator kept going from its own position and wrote it back at its next batch."""
    rnd = random.Random(1)
    corpus = [[rnd.randrange(8000) for _ in range(rnd.randint(3, 20))] for _ in range(300)]

    def make(documents):
        return PackedLoader(16, 4, corpus=documents, prefetch=0, pin_memory=False, shuffle_buffer=100, seed=3, epochs=2)

    loader = make(corpus)
    iterator = iter(loader)
    for _ in range(203):
        next(iterator)
    state = loader.state_dict()
    beyond = sorted({doc for doc, _, _ in state["pending"] if doc >= state["source_position"]})
    assert state["epoch"] == 1 and beyond, "the case needs pending pieces of documents past source_position"
    rest = [sequences_of(b) for b in iterator]
    resumed = make(corpus)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [sequences_of(b) for b in resumed] == rest  # the same corpus resumes exactly
    changed = corpus[: state["source_position"]] + [list(reversed(d)) for d in corpus[state["source_position"]:]]
    other = make(changed)
    other.load_state_dict(state)  # config, digest of the read documents and fields: all as saved
    with pytest.raises(ValueError, match=r"^state\['pending'\] pieces do not match the corpus: their tokens differ"):
        next(iter(other))
    # A state saved before pending_digest existed still loads (the check needs the digest).
    legacy = make(corpus)
    legacy.load_state_dict({k: v for k, v in state.items() if k != "pending_digest"})
    assert [sequences_of(b) for b in legacy] == rest

    loader = make(corpus)
    live = iter(loader)
    for _ in range(5):
        next(live)
    at_five = loader.state_dict()
    for _ in range(50):
        next(live)
    loader.load_state_dict(at_five)
    with pytest.raises(RuntimeError, match=r"^this iteration of the loader was superseded: load_state_dict\(\) was called"):
        next(live)
    assert loader.state_dict()["batches"] == 5  # the load was kept
    fresh = make(corpus)
    expected = [sequences_of(b) for b in islice(iter(fresh), 5, 8)]
    assert [sequences_of(b) for b in islice(iter(loader), 3)] == expected  # continues at batch 5


def test_the_state_recorded_at_each_batch_does_not_hash_tokens(monkeypatch):
    """Found by the profiling suite on the H200 at d4eff64: state_dict()'s pending_digest was
    computed at every batch (the loader records its state per batch), hashing every pending
    token, and the captured step of the profiling suite waited on the prefetch queue for its next
    batch (the "next batch" phase of the d4eff64 recording). The digest is now computed only when a state is saved or
    resumed; its value is the BLAKE2b of the pending pieces' tokens, as documented."""
    import hashlib

    import attn_gym_lite.data.loader as loader_module

    calls = []
    real = loader_module._pending_digest
    monkeypatch.setattr(loader_module, "_pending_digest", lambda pieces: calls.append(1) or real(pieces))
    rnd = random.Random(4)
    corpus = [[rnd.randrange(8000) for _ in range(rnd.randint(3, 40))] for _ in range(200)]

    def make():
        return PackedLoader(32, 4, corpus=corpus, prefetch=0, pin_memory=False, shuffle_buffer=50, seed=5, epochs=2)

    loader = make()
    iterator = iter(loader)
    next(iterator)  # building the stream checks the (empty) saved digest once: O(pieces), once
    calls.clear()
    for _ in range(39):
        next(iterator)
    assert calls == []  # 39 more batches, no hashing (there was one per batch)
    state = loader.state_dict()
    assert len(calls) == 1 and state["pending"]
    # Independent reference: the documented digest of the pending pieces, from the corpus itself.
    reference = hashlib.blake2b(digest_size=16)
    for doc, start, stop in state["pending"]:
        reference.update(f"{doc},{start}:".encode() + ",".join(map(str, corpus[doc][start:stop])).encode() + b";")
    assert state["pending_digest"] == reference.hexdigest()
    rest = [sequences_of(b) for b in islice(iterator, 10)]
    # Stopping and iterating again continues from the in-memory state (its digest checked then).
    loader = make()
    first = iter(loader)
    for _ in range(40):
        next(first)
    first.close()
    assert [sequences_of(b) for b in islice(iter(loader), 10)] == rest
    assert json.loads(json.dumps(loader.state_dict()))["pending_digest"] == loader.state_dict()["pending_digest"]
