"""Tests for attn_gym_lite.data.PackedLoader: batches, determinism, save/restore, prefetch.

The reference for "no token lost or duplicated" is every document tokenized on its own and cut
by the boundary rule: the loader's sequences over a whole run must be exactly those pieces (each
``epochs`` times), whatever the shuffle and the policy did to their order. The reference for
resuming is the uninterrupted run: the batches seen before saving plus those of a fresh loader
after load_state_dict must be the batches of one pass, bit for bit.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
from itertools import islice
from pathlib import Path

import pytest
import torch
from helpers import ByteTokenizer, assert_batch_invariants, sequences_of

from attn_gym_lite.data import BestFit, FirstFit, InOrder, PackedLoader, jsonl_texts, segment

TENSOR_FIELDS = ("input_ids", "labels", "loss_mask", "cu_seqlens")


def random_corpus(seed: int, count: int = 40, longest: int = 90) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefgh \n", k=rng.randint(0, longest))) for _ in range(count)]


def expected_pieces(corpus, size):
    tokenizer = ByteTokenizer()
    return [tuple(piece) for text in corpus if len(ids := tokenizer.encode(text)) >= 2 for piece in segment(ids, size)]


def same_batches(first, second) -> bool:
    return len(first) == len(second) and all(
        all(torch.equal(getattr(a, f), getattr(b, f)) for f in TENSOR_FIELDS)
        and (a.active_tokens, a.active_sequences, a.max_seqlen) == (b.active_tokens, b.active_sequences, b.max_seqlen)
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
    assert packed == sorted(expected_pieces(corpus, 24) * LOADER_CASES[case].get("epochs", 1))


@pytest.mark.parametrize(
    ("name", "corpus", "pieces"),
    [
        ("all longer than T", ["x" * 150, "y" * 64, "z" * 129], [64, 64, 22, 64, 64, 64, 1]),
        ("all length 2", ["ab"] * 70, [2] * 70),
        ("exactly T", ["q" * 64] * 5, [64] * 5),
        ("empty and one-token documents", ["", "ab", "", "x", "cde", ""], [2, 3]),
        ("nothing to pack", ["", "a"], []),
    ],
)
@pytest.mark.parametrize("policy", [InOrder(), FirstFit(8), BestFit(8)], ids=lambda p: p.label)
def test_loader_on_adversarial_corpora(name, corpus, pieces, policy):
    loader = PackedLoader(64, corpus=corpus, tokenizer=ByteTokenizer(), policy=policy, prefetch=0)
    batches = list(loader)
    for batch in batches:
        assert_batch_invariants(batch, 64, loader.sequence_capacity)
        assert batch.active_sequences <= policy.sequence_bound(64)
    assert sorted(len(s) for b in batches for s in sequences_of(b)) == sorted(pieces), name


def test_loader_is_deterministic_for_a_seed_and_the_seed_matters():
    corpus = random_corpus(3, count=60)
    first = list(make(corpus, seed=7, shuffle_buffer=16))
    assert same_batches(first, list(make(corpus, seed=7, shuffle_buffer=16, prefetch=3)))
    assert not same_batches(first, list(make(corpus, seed=8, shuffle_buffer=16)))
    # shuffle_buffer=1 keeps corpus order: the seed has no effect, and in order reproduces the
    # plain in-order packing of the pieces.
    runs = [list(make(corpus, seed=s, shuffle_buffer=1, policy=InOrder(), sequence_capacity=64)) for s in (1, 2)]
    assert same_batches(*runs)
    assert [tuple(s) for b in runs[0] for s in sequences_of(b)] == expected_pieces(corpus, 24)
    # epochs=None repeats the corpus; a corpus without a piece ends instead of spinning.
    assert len(list(islice(make(["abcdefgh"] * 3, epochs=None), 10))) == 10
    assert list(make(["a", ""], epochs=None)) == []


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
    loader = make(random_corpus(2, count=12))
    first = list(loader)
    state = loader.state_dict()
    state["pending"].append([0, 0, 1])  # mutating the copy does not touch the loader
    assert loader.state_dict()["batches"] == 0 and loader.state_dict()["pending"] == []
    assert same_batches(first, list(loader))


def test_restore_reads_a_corpus_function_or_pre_tokenized_documents_again(tmp_path):
    texts = random_corpus(9, count=25)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    as_ids = [ByteTokenizer().encode(text) for text in texts]
    as_ids[3] = tuple(as_ids[3])
    reference = list(make(texts, seed=2, shuffle_buffer=9))
    for corpus in (functools.partial(jsonl_texts, path), as_ids):
        assert same_batches(list(make(corpus, seed=2, shuffle_buffer=9)), reference)
        loader = make(corpus, seed=2, shuffle_buffer=9)
        seen = list(islice(loader, 4))
        resumed = make(corpus, seed=2, shuffle_buffer=9)
        resumed.load_state_dict(loader.state_dict())
        assert same_batches(seen + list(resumed), reference)


def long_corpus(seed=1, count=300):
    rnd = random.Random(seed)
    return [[rnd.randrange(250) for _ in range(rnd.randint(3, 20))] for _ in range(count)]


def make_long(documents, **overrides):
    arguments = dict(corpus=documents, tokenizer=ByteTokenizer(), prefetch=0, pin_memory=False, shuffle_buffer=100,
                     seed=3, epochs=2)
    return PackedLoader(16, 4, **(arguments | overrides))


def test_a_state_from_another_corpus_tokenizer_or_configuration_is_refused():
    corpus = random_corpus(4, count=30)
    loader = make(corpus, shuffle_buffer=7)
    seen = list(islice(loader, 2))
    state = json.loads(json.dumps(loader.state_dict()))

    class ShiftedBytes(ByteTokenizer):  # the same name and vocabulary, other ids
        def encode(self, text):
            return [(token + 1) % 256 for token in super().encode(text)]

    # Same lengths, other text; the same documents reordered; another tokenizer; other settings.
    edited = [text.translate(str.maketrans("abcdefgh", "ijklmnop")) for text in corpus]
    others = [make(edited, shuffle_buffer=7), make([corpus[1], corpus[0], *corpus[2:]], shuffle_buffer=7),
              make(corpus, shuffle_buffer=7, tokenizer=ShiftedBytes()), make(corpus, shuffle_buffer=7, seed=1),
              make(corpus, shuffle_buffer=7, policy=FirstFit(32))]
    # After an epoch boundary, pending pieces may come from documents past source_position, which
    # the documents read this epoch do not cover: reversing those documents is refused too.
    documents = long_corpus()
    epoch_loader = make_long(documents)
    list(islice(epoch_loader, 203))
    epoch_state = epoch_loader.state_dict()
    position = epoch_state["source_position"]
    assert epoch_state["epoch"] == 1 and any(doc >= position for doc, _, _ in epoch_state["pending"])
    changed = documents[:position] + [list(reversed(d)) for d in documents[position:]]
    for other, saved in [(loader, state) for loader in others] + [(make_long(changed), epoch_state)]:
        with pytest.raises(ValueError, match="state"):
            other.load_state_dict(saved)
    resumed = make(corpus, shuffle_buffer=7)  # the corpus it was saved on resumes exactly
    resumed.load_state_dict(state)
    assert same_batches(seen + list(resumed), list(make(corpus, shuffle_buffer=7)))


def test_resuming_across_an_epoch_boundary_and_a_superseded_iterator():
    documents = long_corpus()
    reference = [sequences_of(b) for b in make_long(documents)]
    loader = make_long(documents)
    iterator = iter(loader)
    for _ in range(203):
        next(iterator)
    resumed = make_long(documents)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert [sequences_of(b) for b in resumed] == reference[203:]
    # load_state_dict during a live iteration: the old iterator must not write its position over
    # the loaded one; it stops, and a new iteration continues from the loaded state.
    loader = make_long(documents)
    live = iter(loader)
    for _ in range(5):
        next(live)
    at_five = loader.state_dict()
    for _ in range(50):
        next(live)
    loader.load_state_dict(at_five)
    with pytest.raises(RuntimeError, match="superseded"):
        next(live)
    assert [sequences_of(b) for b in islice(iter(loader), 3)] == reference[5:8]


def test_worker_errors_reach_the_consumer_and_stopping_early_stops_the_worker():
    def corpus():
        yield "abcdef" * 20
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(make(corpus, prefetch=2))
    before = set(threading.enumerate())  # other tests' loaders may still hold threads
    loader = make(random_corpus(6, count=200), prefetch=2)
    iterator = iter(loader)
    next(iterator)
    ours = [t for t in threading.enumerate() if t not in before and t.name == "PackedLoader-prefetch"]
    assert len(ours) == 1 and ours[0].is_alive()
    iterator.close()
    ours[0].join(timeout=10)
    assert not ours[0].is_alive()
    assert loader.state_dict()["batches"] == 1  # the position is the consumer's, not the worker's


@pytest.mark.gpu
def test_batches_are_pinned_with_cuda():
    batch = next(iter(make(random_corpus(1), prefetch=1)))
    assert all(getattr(batch, f).is_pinned() for f in TENSOR_FIELDS)


def test_a_program_that_leaves_prefetching_loaders_unfinished_exits_cleanly():
    """Unfinished, unclosed iterators at exit: the workers are stopped first; a worker still in
    torch while the interpreter finalizes aborted the process (exit code 134)."""
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
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "trained"), done.stderr[-2000:]
