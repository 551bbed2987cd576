"""The loader: documents → tokens → pieces → a packing policy → :class:`PackedBatch`.

:class:`PackedLoader` is the package's one loader, for training runs and for the book alike: any
policy (default: best-fit with the seed article's 32-candidate buffer), a seeded shuffle buffer
(``shuffle_buffer=1`` keeps the corpus order), several epochs, background prefetch into pinned
memory, and ``state_dict()`` / ``load_state_dict()`` so that a resumed run continues on exactly
the batch it would have seen next.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import itertools
import math
import os
import queue
import random
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from ..checks import check_capacities, check_int
from .batch import PackedBatch, pack_pieces
from .corpora import python_stdlib_corpus
from .packing import BestFit, PackingPolicy
from .segment import segment
from .tokenizer import Tokenizer, corpus_function, encode_in_chunks, resolve_tokenizer

__all__ = ["PackedLoader"]

Item = TypeVar("Item")


# The prefetch workers of iterators not yet finished or closed: (stop event, thread).
_WORKERS: set[tuple[threading.Event, threading.Thread]] = set()
_WORKERS_LOCK = threading.Lock()
#: How long the interpreter's exit waits for each prefetch worker to finish its current item (s).
_EXIT_JOIN_TIMEOUT_S = 30.0


@atexit.register
def _stop_workers() -> None:
    # An iterator left unfinished when the program ends (``for batch, _ in zip(loader, range(n))``,
    # a ``break``, an ``epochs=None`` loader) still has its daemon worker making a batch. Were it
    # still in torch when the interpreter finalizes, the process would abort ("terminate called
    # without an active exception", exit code 134): stop every worker first, at exit.
    with _WORKERS_LOCK:
        workers = list(_WORKERS)
    for stop, _ in workers:
        stop.set()
    for _, worker in workers:
        worker.join(timeout=_EXIT_JOIN_TIMEOUT_S)


def _in_background(items: Iterator[Item], depth: int) -> Iterator[Item]:
    """Run ``items`` in a worker thread, ``depth`` items ahead of the consumer.

    Tokenizing (Rust, which releases the GIL) and pinning overlap with the training step. An
    exception in the worker is re-raised in the consumer; when the consumer stops early, the
    worker stops after the item it is producing, and so it does at the interpreter's exit when
    the consumer was never finished or closed.
    """
    channel: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    finished = object()

    def put(message: tuple[bool, object]) -> bool:
        # A bounded wait, so the worker notices ``stop`` even while the queue is full.
        while not stop.is_set():
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


def _rng_state_to_json(state: tuple) -> list:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _rng_state_from_json(state: list) -> tuple:
    """The ``random.Random`` state ``state_dict()`` wrote, checked entry by entry: ``setstate``
    itself truncates words of 2**32 or more silently, raises OverflowError for negative ones, and
    takes a version or ``gauss_next`` of the wrong kind."""
    if not isinstance(state, (list, tuple)) or len(state) != 3:
        raise ValueError("not a [version, [625 ints], gauss_next] triple")
    version, internal, gauss_next = state
    if type(version) is not int or version != 3:
        raise ValueError(f"version must be 3 (random.Random's), got {version!r:.20}")
    if not isinstance(internal, (list, tuple)) or len(internal) != 625:
        raise ValueError("the internal state must be a list of 625 ints")
    for i, word in enumerate(internal):
        bound = 625 if i == 624 else 2**32  # 624 Mersenne Twister words, then the position
        if type(word) is not int or not 0 <= word < bound:
            raise ValueError(f"internal state entry {i} must be an int in [0, {bound}), got {word!r:.30}")
    if gauss_next is not None and (type(gauss_next) is not float or not math.isfinite(gauss_next)):
        raise ValueError(f"gauss_next must be None or a finite float, got {gauss_next!r:.30}")
    return (version, tuple(internal), gauss_next)


_END = object()


def _check_list(argument: str, value: object) -> list:
    """``value`` if it is a list (a JSON array: tuples, from a state built by hand, too)."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{argument} must be a list, got {type(value).__name__}: {value!r:.60}")
    return list(value)
_STATE_KEYS = {"config", "epoch", "source_position", "corpus_digest", "shuffle", "rng", "pending", "batches"}
#: Written by state_dict() and checked where present (a state saved before it existed has none).
_OPTIONAL_STATE_KEYS = {"pending_digest"}


def _pending_digest(pieces: Iterable[tuple[int, int, Sequence[int]]]) -> str:
    """BLAKE2b of the unpacked pieces' token ids, in stream order. ``corpus_digest`` covers the
    documents read this epoch; after an epoch boundary, pieces of the previous epoch may come from
    documents past ``source_position``, which it does not cover: this does."""
    digest = hashlib.blake2b(digest_size=16)
    for doc, start, ids in pieces:
        digest.update(f"{doc},{start}:".encode() + ",".join(map(str, ids)).encode() + b";")
    return digest.hexdigest()

class _PendingPieces:
    """The unpacked pieces after one batch, held by reference, for ``state['pending_digest']``.

    Every batch records the loader's state, so the state must cost O(pieces), not O(tokens): when
    it hashed the pieces' token ids at every batch, the profiling suite's captured step on the H200
    waited on the prefetch queue for the next batch (its "next batch" phase, recorded at d4eff64).
    The pieces are never mutated once cut (``take`` pops them whole), so keeping references is
    exact; the digest is computed when a state is saved (:meth:`PackedLoader.state_dict`) or
    resumed. ``test_the_state_recorded_at_each_batch_does_not_hash_tokens`` counts the hashing."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: Iterable[tuple[int, int, Sequence[int]]]) -> None:
        self.pieces = tuple(pieces)

    def digest(self) -> str:
        return _pending_digest(self.pieces)


#: The corpus digest of no document: the value at the start of every epoch.
_EMPTY_DIGEST = hashlib.blake2b(digest_size=16).hexdigest()
#: Text every tokenizer encodes once, for its fingerprint (letters, digits, code, whitespace, non-ASCII).
_TOKENIZER_PROBE = "def probe(x):\n    return x ** 2  # The quick brown fox, 0123456789; naïve café 東京 🙂\t<|endoftext|>"


def _next_digest(digest: str, document: object) -> str:
    """The corpus digest after one more document: a chained BLAKE2b over the documents read this
    epoch, so a saved position can be checked against the corpus it is restored on."""
    if isinstance(document, str):
        data = b"s" + document.encode("utf-8", "surrogatepass")
    elif isinstance(document, (list, tuple)):
        data = b"i" + ",".join(map(str, document)).encode()
    else:  # refused by check_document when it is tokenized; digested as it is until then
        data = b"?" + repr(document).encode("utf-8", "backslashreplace")
    return hashlib.blake2b(bytes.fromhex(digest) + data, digest_size=16).hexdigest()


def _tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """``vocab_size`` and a digest of the ids of a fixed probe text: two tokenizers with one name
    (one path, a retrained file) but different vocabularies or merges differ here."""
    ids = tokenizer.encode_batch([_TOKENIZER_PROBE])[0]
    digest = hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=8).hexdigest()
    return f"vocab{tokenizer.vocab_size}-{digest}"


class _PieceStream:
    """Documents → seeded shuffle buffer → tokens → pieces, with every position recorded.

    ``store`` holds each piece from the moment it is read until a batch takes it, keyed by its
    stream position and in stream order: the policy's candidate buffer plus the pieces tokenized
    but not yet handed over. Together with the corpus position, the shuffle buffer's document
    indices and the random generator, that is the whole state (see :mod:`.packing` on why
    re-feeding the unpacked pieces first reproduces the policy's future batches).
    """

    def __init__(self, loader: PackedLoader, state: dict) -> None:
        self.loader = loader
        self.epoch = state["epoch"]
        self.source_position = state["source_position"]
        self.corpus_digest = state["corpus_digest"]
        self.batches = state["batches"]
        self.rng = random.Random()
        self.rng.setstate(_rng_state_from_json(state["rng"]))
        self.store: dict[int, tuple[int, int, Sequence[int]]] = {}  # position: (doc, start, ids)
        self.next_position = 0
        self.pieces_this_epoch = 0
        self.epoch_resumed = self.source_position > 0 or bool(state["pending"])

        needed = set(state["shuffle"]) | {doc for doc, _, _ in state["pending"]}
        documents = self._read(needed)
        self.shuffle = [(doc, documents[doc]) for doc in state["shuffle"]]
        pending_docs = sorted({doc for doc, _, _ in state["pending"]})
        pairs = ((doc, documents[doc]) for doc in pending_docs)
        encoded = {doc: ids for chunk in encode_in_chunks(pairs, loader.tokenizer) for doc, ids in chunk}
        for doc, start, stop in state["pending"]:
            ids = encoded[doc][start:stop]
            if len(ids) != stop - start:
                raise ValueError(
                    f"state piece (document {doc}, tokens {start}:{stop}) does not match the "
                    f"corpus, which gives {len(encoded[doc])} tokens for that document: "
                    "was the state saved with another corpus or tokenizer?"
                )
            self._add(doc, start, ids)
        saved = state.get("pending_digest")
        if isinstance(saved, _PendingPieces):  # this loader's own state, not yet saved
            saved = saved.digest()
        if saved is not None and saved != _pending_digest(self.store.values()):
            raise ValueError(
                "state['pending'] pieces do not match the corpus: their tokens differ from those saved "
                "(pieces left over from the previous epoch may come from documents past "
                "state['source_position'], which state['corpus_digest'] does not cover): was the state "
                "saved with another corpus or tokenizer?"
            )
        self.source: Iterator[object] | None = itertools.islice(
            self._open(), self.source_position, None
        )

    def _open(self) -> Iterator[object]:
        return iter(self.loader.corpus())

    def _read(self, needed: set[int]) -> dict[int, object]:
        """The documents with these corpus indices (reads the corpus from the start)."""
        found: dict[int, object] = {}
        if not needed:
            return found
        count = 0
        for count, document in enumerate(self._open(), start=1):
            if count - 1 in needed:
                found[count - 1] = document
                if len(found) == len(needed):
                    return found
        raise ValueError(
            f"state refers to documents {sorted(needed - set(found))[:5]} but the corpus has "
            f"only {count} documents: was the state saved with another corpus?"
        )

    def _add(self, doc: int, start: int, ids: Sequence[int]) -> None:
        self.store[self.next_position] = (doc, start, ids)
        self.next_position += 1

    def _next_document(self) -> tuple[int, object] | None:
        """The next ``(corpus index, document)`` out of the shuffle buffer; None at the end of
        the epoch."""
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
        """Start the next epoch; False when the run is over (the state then stays at the end
        of the last epoch, so a restored stream ends too)."""
        # An epoch read from its start that gave no piece would give none the next time
        # either: stop instead of looping forever.
        empty = self.pieces_this_epoch == 0 and not self.epoch_resumed
        epochs = self.loader.epochs
        if empty or (epochs is not None and self.epoch + 1 >= epochs):
            return False
        self.epoch += 1
        self.source_position, self.pieces_this_epoch, self.epoch_resumed = 0, 0, False
        self.corpus_digest = _EMPTY_DIGEST
        self.source = self._open()
        return True

    def _epoch_documents(self) -> Iterator[tuple[int, object]]:
        """``(corpus index, document)`` out of the shuffle buffer until the epoch ends."""
        while (document := self._next_document()) is not None:
            yield document

    def lengths(self) -> Iterator[int]:
        """Lengths of the restored pieces, then of each new piece as documents are read."""
        for position in list(self.store):
            yield len(self.store[position][2])
        size = self.loader.max_piece_tokens
        while True:
            for chunk in encode_in_chunks(self._epoch_documents(), self.loader.tokenizer):
                new_lengths = []
                for doc, ids in chunk:
                    if len(ids) < self.loader.min_document_tokens:
                        continue
                    start = 0
                    for piece in segment(ids, size):
                        self._add(doc, start, piece)
                        new_lengths.append(len(piece))
                        start += len(piece)
                self.pieces_this_epoch += len(new_lengths)
                # Every piece of the chunk is in ``store`` before the first is handed over, so the
                # saved state never misses a document the shuffle buffer has already released.
                yield from new_lengths
            if not self._next_epoch():
                return

    def take(self, position: int) -> Sequence[int]:
        return self.store.pop(position)[2]

    def state(self) -> dict:
        return {
            "config": self.loader._config(),
            "epoch": self.epoch,
            "source_position": self.source_position,
            "corpus_digest": self.corpus_digest,
            "shuffle": [doc for doc, _ in self.shuffle],
            "rng": _rng_state_to_json(self.rng.getstate()),
            "pending": [[doc, start, start + len(ids)] for doc, start, ids in self.store.values()],
            "pending_digest": _PendingPieces(self.store.values()),  # hashed only when saved
            "batches": self.batches,
        }


class PackedLoader:
    """Packed, fixed-capacity batches from a corpus, prefetched, pinned and resumable.

    Pipeline: the corpus's documents pass through a seeded shuffle buffer, are tokenized in
    chunks (documents given as lists of token ids, a pre-tokenized corpus, are not encoded, but
    their ids are checked against the tokenizer's vocabulary),
    cut into pieces of at most ``max_piece_tokens``
    (:func:`~attn_gym_lite.data.segment`), and packed by ``policy`` into batches of ``T`` token
    rows and ``N`` sequence slots. Epochs follow each other without a break: pieces an epoch
    leaves in the candidate buffer are packed with the next epoch's first pieces; the last epoch
    ends with the buffer's leftovers (a partial batch).

    Iterating yields :class:`PackedBatch` es. With ``prefetch >= 1`` a background thread
    produces them ``prefetch`` batches ahead (tokenizing and pinning while the GPU trains); with
    ``pin_memory`` they are in page-locked memory when CUDA is available, ready for
    ``copy_(..., non_blocking=True)`` into a graph's static buffers.

    Resuming: :meth:`state_dict` describes the position after the last batch the caller
    received (not the prefetched ones): the corpus position, the shuffle buffer's document
    indices, the random generator's state and the unpacked pieces as (document index, token
    range). It is plain JSON-ready data. A new loader with the same arguments, after
    :meth:`load_state_dict`, yields exactly the batches the first one would have yielded next.
    Restoring re-reads the corpus up to the saved position (without tokenizing it), so the
    corpus must be re-readable: a list of documents or a zero-argument function returning an
    iterable of them, such as ``functools.partial(jsonl_texts, "data.jsonl")``.
    A pass that runs to the end resets the position, so iterating again starts over.

    Args:
        token_capacity: ``T`` (tokens), >= 1.
        sequence_capacity: ``N``, ``1 <= N <= T``; default the policy's guaranteed bound
            (``min(B, T)`` for a buffer of ``B``; ``T`` in order), so that no batch is cut
            short by the cap.
        corpus: a zero-argument function returning documents, or a sequence of documents; a
            document is a string or a list/tuple of token ids (already tokenized). Default
            :func:`~attn_gym_lite.data.python_stdlib_corpus`.
        tokenizer: a :class:`~attn_gym_lite.data.Tokenizer` or a
            :func:`~attn_gym_lite.data.load_tokenizer` spec: it encodes string documents, and its
            ``vocab_size`` bounds the ids of pre-tokenized ones (pass the tokenizer they came
            from); its name is part of the saved state; default the stdlib BPE.
        policy: a :class:`~attn_gym_lite.data.PackingPolicy`; default ``BestFit(32)``.
        max_piece_tokens: ``S``, longest piece (tokens), ``1..T``; default ``T``.
        min_document_tokens: drop documents with fewer tokens (>= 1).
        shuffle_buffer: documents held for shuffling (>= 1); each one read is drawn at random
            from this many (``1`` keeps the corpus order, and then ``seed`` has no effect).
        seed: seed of the shuffle (>= 0). Same arguments and seed: same batches.
        epochs: passes over the corpus (>= 1), or None to repeat it forever.
        prefetch: batches produced ahead in a background thread (>= 0; 0: in the caller's
            thread). The thread stops when its iterator ends or is closed, or at the program's
            exit (an iterator left unfinished needs no ``close()``).
        pin_memory: pin each batch (:meth:`PackedBatch.pin_memory`; without CUDA a no-op).

    Raises:
        TypeError, ValueError: an argument has the wrong type or range (checked here); a
            document is neither a string nor a list/tuple, or a pre-tokenized one holds an id
            that is not an int in ``[0, tokenizer.vocab_size)`` (when reached, while iterating;
            the message names ``corpus[index][position]`` and the id); a corpus function that
            needs arguments (here) or returns a string or a non-iterable (while iterating,
            :func:`~attn_gym_lite.data.tokenizer.corpus_function`); a tokenizer whose
            ``vocab_size`` or ``name`` is malformed (here) or whose ``encode_batch`` returns other
            than one list of in-vocabulary int ids per text (while iterating).
        FileNotFoundError: a tokenizer spec names a missing file.

    Source: seed article, "Show me the data!" (look-ahead packing with a candidate buffer);
    the state follows ``torch.utils.data``'s ``state_dict``/``load_state_dict`` convention.
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
        min_document_tokens: int = 2,
        shuffle_buffer: int = 1024,
        seed: int = 0,
        epochs: int | None = 1,
        prefetch: int = 2,
        pin_memory: bool = True,
    ) -> None:
        self.token_capacity = check_int("token_capacity", token_capacity, minimum=1)
        if policy is None:
            policy = BestFit(32)
        elif not isinstance(policy, PackingPolicy):
            raise TypeError(
                f"policy must be a PackingPolicy (InOrder, FirstFit, BestFit), "
                f"got {type(policy).__name__}"
            )
        self.policy = policy
        if sequence_capacity is None:
            sequence_capacity = policy.sequence_bound(self.token_capacity)
        _, self.sequence_capacity = check_capacities(self.token_capacity, sequence_capacity)
        self.max_piece_tokens = check_int(
            "max_piece_tokens",
            self.token_capacity if max_piece_tokens is None else max_piece_tokens,
            minimum=1,
            maximum=self.token_capacity,
        )
        self.min_document_tokens = check_int(
            "min_document_tokens", min_document_tokens, minimum=1
        )
        self.shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        self.epochs = None if epochs is None else check_int("epochs", epochs, minimum=1)
        self.prefetch = check_int("prefetch", prefetch, minimum=0)
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be a bool, got {type(pin_memory).__name__}")
        self.pin_memory = pin_memory
        self.corpus = self._corpus_function(corpus)
        self.tokenizer = resolve_tokenizer(tokenizer)
        self._tokenizer_fingerprint = _tokenizer_fingerprint(self.tokenizer)
        self._state = self._initial_state()
        self._generation = 0  # see __iter__: which iteration owns the state

    @staticmethod
    def _corpus_function(corpus: object) -> Callable[[], Iterable[object]]:
        if corpus is None:
            return python_stdlib_corpus
        if callable(corpus):
            return corpus_function(corpus)
        if isinstance(corpus, Sequence) and not isinstance(corpus, (str, bytes)):
            if len(corpus) == 0:
                raise ValueError("corpus must hold at least one document, got an empty sequence (no batch could be made)")
            return lambda: iter(corpus)
        raise TypeError(
            "corpus must be re-readable so that a saved position can be restored: a sequence "
            "of documents or a zero-argument function returning an iterable of them (e.g. "
            f"functools.partial(jsonl_texts, path)), got {type(corpus).__name__}"
        )

    def _config(self) -> dict:
        return {
            "token_capacity": self.token_capacity,
            "sequence_capacity": self.sequence_capacity,
            "policy": self.policy.label,
            "max_piece_tokens": self.max_piece_tokens,
            "min_document_tokens": self.min_document_tokens,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            "epochs": self.epochs,
            "tokenizer": self.tokenizer.name,
            "tokenizer_fingerprint": self._tokenizer_fingerprint,
        }

    def _initial_state(self) -> dict:
        return {
            "config": self._config(),
            "epoch": 0,
            "source_position": 0,
            "corpus_digest": _EMPTY_DIGEST,
            "shuffle": [],
            "rng": _rng_state_to_json(random.Random(self.seed).getstate()),
            "pending": [],
            "pending_digest": _EMPTY_DIGEST,  # BLAKE2b of nothing, as _pending_digest(()) gives
            "batches": 0,
        }

    def _produce(self, state: dict) -> Iterator[tuple[PackedBatch, dict]]:
        stream = _PieceStream(self, state)
        for positions in self.policy.batches(
            stream.lengths(), self.token_capacity, self.sequence_capacity
        ):
            pieces = [stream.take(position) for position in positions]
            # The policy kept 1..N non-empty pieces of <= T tokens; their ids are a tokenizer's or
            # checked by check_token_ids: assemble them without batch_from_pieces's per-id checks.
            batch = pack_pieces(pieces, [len(piece) for piece in pieces], self.token_capacity, self.sequence_capacity)
            if self.pin_memory:
                batch = batch.pin_memory()
            stream.batches += 1
            yield batch, stream.state()

    def __iter__(self) -> Iterator[PackedBatch]:
        # One live iteration owns the loader's state. A later iteration, or load_state_dict,
        # supersedes it: before, the older iterator kept running from its own copy and wrote its
        # position back over the loaded state at its next batch (the load was silently lost).
        self._generation += 1
        generation = self._generation
        from_start = self._state["batches"] == 0
        produced = self._produce(self._state)
        if self.prefetch:
            produced = _in_background(produced, self.prefetch)
        count = 0
        try:
            for batch, state in produced:
                if self._generation != generation:
                    raise RuntimeError(
                        "this iteration of the loader was superseded: load_state_dict() was called, or another "
                        "iteration started, while it was live. Its batches would no longer follow the loader's "
                        "state; start a new iteration (iter(loader)), which continues from that state."
                    )
                self._state = state
                count += 1
                yield batch
            if from_start and count == 0:
                raise ValueError(
                    f"corpus yielded no document of at least min_document_tokens = {self.min_document_tokens} "
                    "tokens: no batch could be made"
                )
        finally:
            # Stop (and join) the prefetch worker now when the consumer stops early, rather than
            # whenever the garbage collector finalizes the inner generator.
            produced.close()
        if self._generation == generation:  # a superseded iteration must not reset the new state
            self._state = self._initial_state()

    def state_dict(self) -> dict:
        """The position after the last batch handed out (JSON-ready; a fresh copy).

        Keys: ``config`` (the arguments it is valid for, and ``tokenizer_fingerprint``: the
        tokenizer's ``vocab_size`` and a digest of its ids for a fixed probe text), ``epoch``,
        ``source_position`` (documents read from the corpus this epoch), ``corpus_digest`` (a
        chained BLAKE2b digest of those documents), ``shuffle`` (corpus indices in the shuffle
        buffer), ``rng`` (the shuffle's generator state), ``pending`` (unpacked pieces as
        ``[document index, start, stop]`` token ranges, in stream order), ``pending_digest`` (a
        BLAKE2b digest of those pieces' token ids: pieces left from the previous epoch may come
        from documents past ``source_position``, which ``corpus_digest`` does not cover) and
        ``batches`` (batches handed out so far).
        """
        state = dict(self._state)
        if isinstance(state["pending_digest"], _PendingPieces):
            state["pending_digest"] = state["pending_digest"].digest()
        return copy.deepcopy(state)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` at the next iteration.

        The next iteration is the next ``iter(loader)``: an iterator live when this is called is
        superseded, and raises a RuntimeError at its next batch instead of continuing from its
        own position (as does an older iterator when a new iteration starts).

        Every field is checked here, against this loader's arguments, so a damaged or foreign
        state fails now rather than part-way through the next iteration: ``epoch`` an int in
        ``[0, epochs)`` (any ``>= 0`` with ``epochs=None``), ``source_position`` an int between 0
        and the number of documents in the corpus (read up to that position, not tokenized),
        ``corpus_digest`` the digest of the corpus's documents up to that position (so a state
        restored on another corpus, or one edited, reordered or with documents inserted before
        that position, is refused instead of resuming at the wrong place), ``shuffle`` at most
        ``shuffle_buffer`` distinct indices below ``source_position``, ``rng`` a generator state
        as :meth:`state_dict` writes it, ``pending`` ``[document, start, stop]`` ranges of 1 to
        ``max_piece_tokens`` tokens, ``batches`` an int ``>= 0``.
        Whether the pending documents exist and have those tokens is checked when iteration
        starts (it needs them tokenized).

        Raises:
            TypeError: ``state`` is not a dict; ``state["config"]`` is not a dict; a field of the
                wrong type (the message names it, e.g. ``state['batches']``;
                ``state['corpus_digest']`` not a hex digest string).
            ValueError: keys are missing or unknown (a ``ShardedPackedLoader``'s ``"shard"``
                included); ``state["config"]`` differs from this loader's
                arguments (the message names the first difference; ``tokenizer_fingerprint``
                for another tokenizer under the same name); a field out of range,
                e.g. ``state['epoch']`` not below ``epochs`` or ``state['source_position']``
                past the corpus's end; a malformed ``state['rng']``; a ``state['corpus_digest']``
                that this corpus's documents up to ``state['source_position']`` do not give.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if missing := _STATE_KEYS - set(state):
            raise ValueError(
                f"state is missing keys {sorted(missing)}; expected {sorted(_STATE_KEYS)}"
            )
        # Nothing else either: a key this loader does not read is a state of another kind (a
        # ShardedPackedLoader's "shard") or a hand edit, and resuming would ignore it.
        if unknown := set(state) - _STATE_KEYS - _OPTIONAL_STATE_KEYS:
            hint = " (a ShardedPackedLoader's state: load it into the same rank's ShardedPackedLoader)" \
                if "shard" in unknown else ""
            raise ValueError(f"state has keys this loader does not read {sorted(map(str, unknown))}{hint}; "
                             f"expected {sorted(_STATE_KEYS)}, and optionally {sorted(_OPTIONAL_STATE_KEYS)}")
        if not isinstance(state["config"], dict):
            raise TypeError(f"state['config'] must be a dict of the loader's arguments, got {type(state['config']).__name__}")
        for key, value in self._config().items():
            if state["config"].get(key) != value:
                raise ValueError(
                    f"state was saved with {key}={state['config'].get(key)!r}, "
                    f"but this loader has {key}={value!r}"
                )
        self._check_state_fields(state)
        self._state = copy.deepcopy(state)
        self._generation += 1  # a live iteration is superseded (it raises at its next batch)

    def _check_state_fields(self, state: dict) -> None:
        """The range and type of each field of a state whose config matches (see
        :meth:`load_state_dict`)."""
        epoch = check_int("state['epoch']", state["epoch"], minimum=0)
        if self.epochs is not None and epoch >= self.epochs:
            raise ValueError(
                f"state['epoch'] must be below this loader's epochs = {self.epochs} (epochs count from 0), got {epoch}"
            )
        # At most sys.maxsize: the corpus is read up to it with islice (past it, a bare ValueError).
        source_position = check_int("state['source_position']", state["source_position"], minimum=0, maximum=sys.maxsize)
        check_int("state['batches']", state["batches"], minimum=0)
        shuffle = _check_list("state['shuffle']", state["shuffle"])
        if len(shuffle) > self.shuffle_buffer:
            raise ValueError(
                f"state['shuffle'] must hold at most shuffle_buffer = {self.shuffle_buffer} document indices, "
                f"got {len(shuffle)}"
            )
        if shuffle and not source_position:
            raise ValueError(
                f"state['shuffle'] must be empty when state['source_position'] is 0 (it holds documents read "
                f"this epoch), got {shuffle[:5]}"
            )
        for i, doc in enumerate(shuffle):
            check_int(f"state['shuffle'][{i}]", doc, minimum=0, maximum=source_position - 1)
        if len(set(shuffle)) != len(shuffle):
            raise ValueError(f"state['shuffle'] must hold distinct document indices, got {shuffle}")
        for i, piece in enumerate(_check_list("state['pending']", state["pending"])):
            name = f"state['pending'][{i}]"
            if not isinstance(piece, (list, tuple)) or len(piece) != 3:
                raise TypeError(f"{name} must be a [document, start, stop] list of 3 ints, got {piece!r}")
            check_int(f"{name}[0] (document)", piece[0], minimum=0)
            start = check_int(f"{name}[1] (start)", piece[1], minimum=0)
            check_int(f"{name}[2] (stop)", piece[2], minimum=start + 1, maximum=start + self.max_piece_tokens)
        try:
            random.Random().setstate(_rng_state_from_json(state["rng"]))
        except (TypeError, ValueError) as error:
            raise ValueError(
                "state['rng'] must be a random.Random state as state_dict() writes it "
                f"([version, [625 ints], gauss_next]), got {state['rng']!r:.60}: {error}"
            ) from None
        for key in ("corpus_digest", "pending_digest"):
            saved_digest = state.get(key, _EMPTY_DIGEST)  # pending_digest is optional
            if not (isinstance(saved_digest, str) and len(saved_digest) == len(_EMPTY_DIGEST)
                    and all(c in "0123456789abcdef" for c in saved_digest)):
                raise TypeError(
                    f"state['{key}'] must be a {len(_EMPTY_DIGEST)}-character hex digest as state_dict() writes "
                    f"it, got {saved_digest!r:.60}"
                )
        saved_digest = state["corpus_digest"]
        # Re-read the documents this epoch had read (not tokenized): a corpus that has fewer, or
        # other documents up to that position, would resume at the wrong place.
        read, digest = 0, _EMPTY_DIGEST
        for document in itertools.islice(self.corpus(), source_position):
            read += 1
            digest = _next_digest(digest, document)
        if read < source_position:
            raise ValueError(
                f"state['source_position'] must be at most the corpus's {read} documents, got {source_position}: "
                "was the state saved with another corpus?"
            )
        if digest != saved_digest:
            raise ValueError(
                f"state['corpus_digest'] must match the corpus's first {source_position} documents (those this "
                f"epoch had read), got {saved_digest} but this corpus gives {digest}: was the state saved with "
                "another corpus, or one edited or reordered since?"
            )

    def __repr__(self) -> str:
        return (
            f"PackedLoader(T={self.token_capacity}, N={self.sequence_capacity}, "
            f"policy={self.policy.label!r}, tokenizer={self.tokenizer.name!r}, "
            f"batches handed out={self._state['batches']})"
        )

