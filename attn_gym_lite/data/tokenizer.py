"""Tokenizers: the :class:`Tokenizer` protocol, the ``tokenizer.json`` and tiktoken wrappers, and
:func:`load_tokenizer`."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from .corpora import python_stdlib_corpus

__all__ = ["Tokenizer", "HFTokenizer", "TiktokenTokenizer", "load_tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What the loaders need from a tokenizer: ids in ``[0, vocab_size)``, and ``encode_batch(texts)
    == [encode(t) for t in texts]``."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer``; no special tokens are added (``cu_seqlens`` marks
    document boundaries), and ``decode`` keeps them (``"<|endoftext|>"`` may be literal text)."""

    def __init__(self, tokenizer: object, name: str) -> None:
        self.backend = tokenizer
        self.name = name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


class TiktokenTokenizer:
    """A ``tiktoken`` encoding; ``encode_ordinary`` keeps special-token strings ordinary text."""

    def __init__(self, encoding: object) -> None:
        self.backend = encoding
        self.name = f"tiktoken:{encoding.name}"
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.backend.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.backend.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


# Documents per encode_batch call: enough for the tokenizer's thread pool, small enough that
# a loader's first batch arrives quickly.
ENCODE_BATCH_SIZE = 64


def encode_in_chunks(documents: Iterable[tuple[int, object]],
                     tokenizer: Tokenizer) -> Iterator[list[tuple[int, Sequence[int]]]]:
    """``[(index, ids), ...]`` per chunk of numbered documents, one ``encode_batch`` call each (a
    list of ids passes as it is); a lazy corpus is read no further than the consumer asks."""
    documents = iter(documents)
    while chunk := list(itertools.islice(documents, ENCODE_BATCH_SIZE)):
        texts = [document for _, document in chunk if isinstance(document, str)]
        encoded = iter(tokenizer.encode_batch(texts) if texts else [])
        yield [(index, next(encoded) if isinstance(document, str) else document) for index, document in chunk]


DEFAULT_VOCAB_SIZE = 8192
DEFAULT_MAX_TRAINING_BYTES = 4_000_000
END_OF_TEXT = "<|endoftext|>"


def _cache_dir() -> Path:
    configured = os.environ.get("ATTN_GYM_LITE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "attn_gym_lite"


def _train_stdlib_bpe(vocab_size: int, max_training_bytes: int) -> object:
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    training_texts, size = [], 0
    for text in python_stdlib_corpus():
        if training_texts and size + len(text.encode("utf-8")) > max_training_bytes:
            break
        training_texts.append(text)
        size += len(text.encode("utf-8"))
    tokenizer = _HFTokenizer(models.BPE())
    # Byte-level pre-tokenization maps every byte to a symbol, so any text encodes (no unknown
    # token) and decoding restores it exactly.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_texts, trainer=trainer)
    return tokenizer


def _default_tokenizer(vocab_size: int, max_training_bytes: int) -> HFTokenizer:
    from tokenizers import Tokenizer as _HFTokenizer

    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    name = f"stdlib-bpe-{python}-vocab{vocab_size}-{max_training_bytes}B"
    path = _cache_dir() / name / "tokenizer.json"
    if path.is_file():
        return HFTokenizer(_HFTokenizer.from_file(str(path)), name)
    tokenizer = _train_stdlib_bpe(vocab_size, max_training_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a concurrent reader (another notebook, a test worker) never sees a
    # half-written file.
    partial = path.with_name(f"tokenizer.json.{os.getpid()}.partial")
    tokenizer.save(str(partial))
    os.replace(partial, path)
    return HFTokenizer(tokenizer, name)


def load_tokenizer(spec: str | os.PathLike[str] | None = None, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                   max_training_bytes: int = DEFAULT_MAX_TRAINING_BYTES) -> HFTokenizer | TiktokenTokenizer:
    """A tokenizer by spec: a path to a HF ``tokenizer.json``; ``"tiktoken:<encoding>"`` (with
    ``attn-gym-lite[tiktoken]``); or None, the default byte-level BPE (``"<|endoftext|>"``
    special token) trained on the first ``max_training_bytes`` of :func:`python_stdlib_corpus`
    (about 1 s) and cached in ``$ATTN_GYM_LITE_CACHE`` or ``~/.cache/attn_gym_lite``.

    Source: HF ``tokenizers`` (``BpeTrainer``, ``ByteLevel``); OpenAI ``tiktoken``.
    """
    if spec is None:
        return _default_tokenizer(vocab_size, max_training_bytes)
    if isinstance(spec, str) and spec.startswith("tiktoken:"):
        import tiktoken

        return TiktokenTokenizer(tiktoken.get_encoding(spec.removeprefix("tiktoken:")))
    from tokenizers import Tokenizer as _HFTokenizer

    return HFTokenizer(_HFTokenizer.from_file(str(spec)), str(spec))


def resolve_tokenizer(tokenizer: object) -> Tokenizer:
    """``tokenizer``, or :func:`load_tokenizer` of it where it is a spec."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer)
    return tokenizer
