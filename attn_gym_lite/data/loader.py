"""The package's one loader: documents → shuffle buffer → tokens → pieces → a packing policy →
:class:`PackedBatch`, prefetched, pinned and exactly resumable."""

from __future__ import annotations

import atexit
import copy
import hashlib
import itertools
import json
import os
import queue
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

from .batch import PackedBatch, pack_pieces
from .corpora import python_stdlib_corpus
from .packing import BestFit, PackingPolicy
from .segment import MIN_DOCUMENT_TOKENS, segment
from .tokenizer import Tokenizer, encode_in_chunks, resolve_tokenizer

__all__ = ["PackedLoader"]

# The prefetch workers of iterators not yet finished or closed: (stop event, thread).
_WORKERS: set[tuple[threading.Event, threading.Thread]] = set()
_WORKERS_LOCK = threading.Lock()


@atexit.register
def _stop_workers() -> None:
    # An iterator left unfinished when the program ends (a `break`, an `epochs=None` loader) still
    # has its daemon worker making a batch. Were it still in torch while the interpreter finalizes,
    # the process would abort (exit code 134): stop every worker first.
    with _WORKERS_LOCK:
        workers = list(_WORKERS)
    for stop, _ in workers:
        stop.set()
    for _, worker in workers:
        worker.join(timeout=30.0)


def _in_background(items: Iterator, depth: int) -> Iterator:
    """``items`` made ``depth`` ahead in a worker thread, which stops when the consumer does."""
    channel: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    finished = object()

    def put(message: tuple[bool, object]) -> bool:
        while not stop.is_set():  # a bounded wait, so the worker notices `stop` with a full queue
            try:
                channel.put(message, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, finished))
        except BaseException as error:  # handed to the consumer, which re-raises it
            put((False, error))

    worker = threading.Thread(target=work, name="PackedLoader-prefetch", daemon=True)
    worker.start()
    with _WORKERS_LOCK:
        _WORKERS.add((stop, worker))
    try:
        while True:
            ok, item = channel.get()
            if not ok:
                raise item
            if item is finished:
                return
            yield item
    finally:
        stop.set()
        worker.join()
        with _WORKERS_LOCK:
            _WORKERS.discard((stop, worker))


_EMPTY_DIGEST = hashlib.blake2b(digest_size=16).hexdigest()
#: Text every tokenizer encodes once: its ids identify the tokenizer in the state's fingerprint.
_TOKENIZER_PROBE = "def probe(x):\n    return x ** 2  # The quick brown fox, 0123456789; naïve café 東京 🙂\t<|endoftext|>"
_END = object()


def _next_digest(digest: str, document: object) -> str:
    """The chained digest of the documents read this epoch, one more document on."""
    data = document.encode("utf-8", "surrogatepass") if isinstance(document, str) else repr(list(document)).encode()
    return hashlib.blake2b(bytes.fromhex(digest) + data, digest_size=16).hexdigest()


class _PieceStream:
    """Documents → seeded shuffle buffer → tokens → pieces. ``store`` holds each piece from when it
    is read until a batch takes it, in stream order; with the corpus position, the shuffle buffer
    and the generator that is the whole state (re-fed first, the unpacked pieces reproduce the
    policy's future batches: see :mod:`.packing`)."""

    def __init__(self, loader: PackedLoader, state: dict) -> None:
        self.loader = loader
        self.epoch, self.source_position, self.batches = state["epoch"], state["source_position"], state["batches"]
        version, internal, gauss_next = state["rng"]
        self.rng = random.Random()
        self.rng.setstate((version, tuple(internal), gauss_next))
        self.store: dict[int, tuple[int, int, Sequence[int]]] = {}  # position: (document, start, ids)
        self.next_position = self.pieces_this_epoch = 0
        self.epoch_resumed = self.source_position > 0 or bool(state["pending"])
        # Re-read (not tokenize) the documents this epoch had read, for their digest, and those
        # the shuffle buffer and the pending pieces refer to.
        needed = set(state["shuffle"]) | {doc for doc, _, _ in state["pending"]}
        documents, self.corpus_digest = {}, _EMPTY_DIGEST
        stop = max(self.source_position, max(needed, default=-1) + 1)
        for index, document in enumerate(itertools.islice(loader.corpus(), stop)):
            if index < self.source_position:
                self.corpus_digest = _next_digest(self.corpus_digest, document)
            if index in needed:
                documents[index] = document
        self.shuffle = [(doc, documents.get(doc, "")) for doc in state["shuffle"]]
        pending = sorted({doc for doc, _, _ in state["pending"]})
        pairs = ((doc, documents.get(doc, "")) for doc in pending)
        encoded = {doc: ids for chunk in encode_in_chunks(pairs, loader.tokenizer) for doc, ids in chunk}
        for doc, start, stop in state["pending"]:
            self._add(doc, start, encoded[doc][start:stop])
        self.source: Iterator | None = itertools.islice(loader.corpus(), self.source_position, None)

    def _add(self, doc: int, start: int, ids: Sequence[int]) -> None:
        self.store[self.next_position] = (doc, start, ids)
        self.next_position += 1

    def _next_document(self) -> tuple[int, object] | None:
        size = self.loader.shuffle_buffer
        while self.source is not None and len(self.shuffle) < size:
            document = next(self.source, _END)
            if document is _END:
                self.source = None
            else:
                self.shuffle.append((self.source_position, document))
                self.source_position += 1
                self.corpus_digest = _next_digest(self.corpus_digest, document)
        if not self.shuffle:
            return None
        # Swap the chosen document to the end and pop it: O(1), and deterministic because the
        # buffer's order is part of the saved state.
        index = self.rng.randrange(len(self.shuffle)) if size > 1 else 0
        self.shuffle[index], self.shuffle[-1] = self.shuffle[-1], self.shuffle[index]
        return self.shuffle.pop()

    def _next_epoch(self) -> bool:
        # An epoch read from its start that gave no piece would give none the next time either:
        # stop instead of looping forever.
        empty = self.pieces_this_epoch == 0 and not self.epoch_resumed
        if empty or (self.loader.epochs is not None and self.epoch + 1 >= self.loader.epochs):
            return False
        self.epoch += 1
        self.source_position, self.pieces_this_epoch, self.epoch_resumed = 0, 0, False
        self.corpus_digest = _EMPTY_DIGEST
        self.source = iter(self.loader.corpus())
        return True

    def lengths(self) -> Iterator[int]:
        for position in list(self.store):
            yield len(self.store[position][2])
        while True:
            documents = iter(self._next_document, None)
            for chunk in encode_in_chunks(documents, self.loader.tokenizer):
                new_lengths = []
                for doc, ids in chunk:
                    if len(ids) < MIN_DOCUMENT_TOKENS:
                        continue
                    start = 0
                    for piece in segment(ids, self.loader.max_piece_tokens):
                        self._add(doc, start, piece)
                        new_lengths.append(len(piece))
                        start += len(piece)
                self.pieces_this_epoch += len(new_lengths)
                # The whole chunk is in `store` before its first piece is handed over, so a saved
                # state never misses a document the shuffle buffer has already released.
                yield from new_lengths
            if not self._next_epoch():
                return

    def take(self, position: int) -> Sequence[int]:
        return self.store.pop(position)[2]

    def fingerprint(self) -> str:
        return self.loader._fingerprint(self.corpus_digest, [ids for _, _, ids in self.store.values()])

    def state(self) -> dict:
        version, internal, gauss_next = self.rng.getstate()
        return {
            "epoch": self.epoch,
            "source_position": self.source_position,
            "shuffle": [doc for doc, _ in self.shuffle],
            "rng": [version, list(internal), gauss_next],
            "pending": [[doc, start, start + len(ids)] for doc, start, ids in self.store.values()],
            "batches": self.batches,
            # Hashed only when the state is saved: hashing every pending token at every batch
            # stalled the captured training step waiting on the prefetch queue.
            "fingerprint": (self.corpus_digest, tuple(ids for _, _, ids in self.store.values())),
        }


class PackedLoader:
    """Packed, fixed-capacity batches from a corpus, prefetched, pinned and resumable.

    Documents pass through a seeded shuffle buffer, are tokenized in chunks (a document given as
    a list of token ids is taken as it is), cut into pieces of at most ``max_piece_tokens``
    (:func:`~attn_gym_lite.data.segment`; documents of one token have no target and are dropped)
    and packed by ``policy`` into :class:`PackedBatch` es of ``T`` rows and ``N`` slots. Epochs
    follow each other without a break. ``prefetch`` batches are made ahead in a thread.

    :meth:`state_dict` is the position after the last batch the caller received, as JSON-ready
    data; a new loader with the same arguments, after :meth:`load_state_dict`, yields exactly the
    batches the first one would have yielded next. Restoring re-reads the corpus up to the saved
    position, so the corpus must be re-readable: a list of documents, or a function returning
    them such as ``functools.partial(jsonl_texts, "data.jsonl")``.

    Args:
        token_capacity: ``T`` (tokens).
        sequence_capacity: ``N``; default the policy's bound on ``M`` (``min(B, T)``; ``T`` in order).
        corpus: a sequence of documents or a function returning them (default the stdlib corpus).
        tokenizer: a :class:`~attn_gym_lite.data.Tokenizer` or a :func:`~attn_gym_lite.data.load_tokenizer` spec.
        policy: default ``BestFit(32)``; ``shuffle_buffer=1`` keeps the corpus order.
        epochs: passes over the corpus, or None to repeat it forever.

    Source: seed article, "Show me the data!" (look-ahead packing with a candidate buffer).
    """

    def __init__(
        self,
        token_capacity: int,
        sequence_capacity: int | None = None,
        *,
        corpus: Callable[[], Iterable[object]] | Sequence[object] | None = None,
        tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
        policy: PackingPolicy | None = None,
        max_piece_tokens: int | None = None,
        shuffle_buffer: int = 1024,
        seed: int = 0,
        epochs: int | None = 1,
        prefetch: int = 2,
        pin_memory: bool = True,
    ) -> None:
        self.token_capacity = token_capacity
        self.policy = BestFit(32) if policy is None else policy
        self.sequence_capacity = (self.policy.sequence_bound(token_capacity) if sequence_capacity is None
                                  else sequence_capacity)
        self.max_piece_tokens = token_capacity if max_piece_tokens is None else max_piece_tokens
        self.shuffle_buffer, self.seed, self.epochs = shuffle_buffer, seed, epochs
        self.prefetch, self.pin_memory = prefetch, pin_memory
        if corpus is None:
            corpus = python_stdlib_corpus
        self.corpus = corpus if callable(corpus) else lambda: iter(corpus)
        self.tokenizer = resolve_tokenizer(tokenizer)
        probe = self.tokenizer.encode_batch([_TOKENIZER_PROBE])[0]
        self._tokenizer_id = f"{self.tokenizer.name}, vocab {self.tokenizer.vocab_size}, probe {list(probe)}"
        self._state = self._initial_state()
        self._generation = 0  # which iteration owns the state (see __iter__)

    def _config(self) -> dict:
        return {"T": self.token_capacity, "N": self.sequence_capacity, "policy": self.policy.label,
                "max_piece_tokens": self.max_piece_tokens, "shuffle_buffer": self.shuffle_buffer,
                "seed": self.seed, "epochs": self.epochs, "tokenizer": self._tokenizer_id}

    def _fingerprint(self, corpus_digest: str, pending: Iterable[Sequence[int]]) -> str:
        # The pending pieces' tokens too: pieces left from the previous epoch may come from
        # documents past the corpus position, which the corpus digest does not cover.
        digest = hashlib.blake2b(json.dumps(self._config()).encode() + corpus_digest.encode(), digest_size=16)
        for ids in pending:
            digest.update(",".join(map(str, ids)).encode() + b";")
        return digest.hexdigest()

    def _initial_state(self) -> dict:
        version, internal, gauss_next = random.Random(self.seed).getstate()
        return {"epoch": 0, "source_position": 0, "shuffle": [], "rng": [version, list(internal), gauss_next],
                "pending": [], "batches": 0, "fingerprint": (_EMPTY_DIGEST, ())}

    def _produce(self, state: dict) -> Iterator[tuple[PackedBatch, dict]]:
        stream = _PieceStream(self, state)
        for positions in self.policy.batches(stream.lengths(), self.token_capacity, self.sequence_capacity):
            pieces = [stream.take(position) for position in positions]
            batch = pack_pieces(pieces, [len(piece) for piece in pieces], self.token_capacity, self.sequence_capacity)
            stream.batches += 1
            yield (batch.pin_memory() if self.pin_memory else batch), stream.state()

    def __iter__(self) -> Iterator[PackedBatch]:
        # One live iteration owns the loader's state. A later iteration, or load_state_dict,
        # supersedes it: the older iterator must not write its position over the newer state.
        self._generation += 1
        generation = self._generation
        produced = self._produce(self._state)
        if self.prefetch:
            produced = _in_background(produced, self.prefetch)
        try:
            for batch, state in produced:
                if self._generation != generation:
                    raise RuntimeError("this iteration of the loader was superseded by load_state_dict() or a newer "
                                       "iteration; start a new one (iter(loader)), which continues from that state")
                self._state = state
                yield batch
        finally:
            produced.close()  # stops (and joins) the prefetch worker now when the consumer stops early
        if self._generation == generation:
            self._state = self._initial_state()

    def state_dict(self) -> dict:
        """The position after the last batch handed out: ``epoch``, ``source_position``, ``shuffle``,
        ``rng``, ``pending`` (``[document, start, stop]``), ``batches`` and ``fingerprint``."""
        state = dict(self._state)
        if isinstance(state["fingerprint"], tuple):
            state["fingerprint"] = self._fingerprint(*state["fingerprint"])
        return copy.deepcopy(state)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` at the next ``iter(loader)``; a state saved with
        another corpus, tokenizer or configuration is refused (its fingerprint differs)."""
        state = copy.deepcopy(state)
        if _PieceStream(self, state).fingerprint() != state["fingerprint"]:
            raise ValueError("state was saved with another corpus, tokenizer or loader configuration: its "
                             "fingerprint differs from this loader's")
        self._state = state
        self._generation += 1  # a live iteration is superseded (it raises at its next batch)

    def __repr__(self) -> str:
        return (f"PackedLoader(T={self.token_capacity}, N={self.sequence_capacity}, policy={self.policy.label!r}, "
                f"tokenizer={self.tokenizer.name!r}, batches handed out={self._state['batches']})")
