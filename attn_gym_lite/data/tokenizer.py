"""Tokenizers: what the loaders need from one, and where to get one.

* :class:`Tokenizer`: the protocol (``name``, ``vocab_size``, ``encode``, ``encode_batch``,
  ``decode``); any object with these members works;
* :class:`HFTokenizer`: a ``tokenizer.json`` through Hugging Face ``tokenizers``;
* :class:`TiktokenTokenizer`: an OpenAI ``tiktoken`` encoding, when tiktoken is installed;
* :func:`load_tokenizer`: one of these by spec, or the default byte-level BPE trained (once,
  then cached) on the standard-library corpus.
"""

from __future__ import annotations

import inspect
import itertools
import numbers
import operator
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..checks import check_file, check_int
from .corpora import python_stdlib_corpus

__all__ = ["Tokenizer", "HFTokenizer", "TiktokenTokenizer", "load_tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What the loaders need from a tokenizer; any object with these members works.

    Attributes:
        name: a human-readable identifier (for plots and logs).
        vocab_size: number of token ids; every id is in ``[0, vocab_size)``.
    """

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(text) for text in texts]``, usually faster (parallel)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; for byte-level tokenizers ``decode(encode(text)) == text``."""
        ...


# The wrappers' own argument checks: the backends give bare errors ("TextInputSequence must be
# str", "'float' object cannot be interpreted as an integer"), or worse, a wrong result: HF's
# encode_batch("abc") encodes each character as a document, and its decode drops an id past the
# vocabulary without a word.
def _check_text(function: str, text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{function}: text must be a str, got {type(text).__name__}: {text!r:.60}")
    return text


def _ordered(function: str, argument: str, values: object, expected: str) -> list:
    """``values`` as a list, refusing what iterates into something else: a string (its
    characters), a mapping (its keys) or a set (no order: results could not be matched back)."""
    if isinstance(values, (str, bytes, Mapping, AbstractSet)) or not isinstance(values, Iterable):
        raise TypeError(f"{function}: {argument} must be {expected}, got {type(values).__name__}: {values!r:.60}")
    return list(values)


def _check_texts(function: str, texts: object) -> list[str]:
    texts = _ordered(function, "texts", texts, "a sequence of str (one per document)")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{function}: texts[{i}] must be a str, got {type(text).__name__}: {text!r:.60}")
    return texts


def _check_ids(function: str, ids: object, vocab_size: int) -> list[int]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()  # a tensor or an array of ids
    ids = _ordered(function, "ids", ids, "a sequence of token ids (ints)")
    if all(type(token) is int for token in ids) and (not ids or (min(ids) >= 0 and max(ids) < vocab_size)):
        return ids  # the common case, in one pass; the loop below only finds and names the fault
    checked = []
    for i, token in enumerate(ids):
        # Anything an index can be (numpy ints, a 0-d integer tensor from list(tensor)), but not a
        # bool or a float.
        try:
            value = operator.index(token) if not isinstance(token, bool) else None
        except TypeError:
            value = None
        if value is None:
            raise TypeError(f"{function}: ids[{i}] must be a token id (an int), got {type(token).__name__}: {token!r:.40}")
        if not 0 <= value < vocab_size:
            raise ValueError(f"{function}: ids[{i}] must be a token id in [0, {vocab_size}), got {value}")
        checked.append(value)
    return checked


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` behind the :class:`Tokenizer` protocol.

    ``encode`` adds no special tokens (no BOS/EOS/CLS): packing marks document boundaries with
    ``cu_seqlens`` instead. Source: HF ``tokenizers`` (``Tokenizer.encode``/``encode_batch``).

    Raises:
        TypeError: ``tokenizer`` is not a ``tokenizers.Tokenizer``, or ``name`` is not a ``str``;
            ``encode`` given a non-``str``, ``encode_batch`` a string or an entry that is not a
            ``str``, ``decode`` an id that is not an int (each message names the method and the
            entry).
        ValueError: ``decode`` given an id outside ``[0, vocab_size)`` (the backend would drop it).
    """

    def __init__(self, tokenizer: object, name: str) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        if not isinstance(tokenizer, _HFTokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer)}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        self.backend = tokenizer
        self.name = name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        text = _check_text("HFTokenizer.encode", text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = _check_texts("HFTokenizer.encode_batch", texts)
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        # Keep special tokens: a document may contain "<|endoftext|>" as literal text.
        ids = _check_ids("HFTokenizer.decode", ids, self.vocab_size)
        return self.backend.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


class TiktokenTokenizer:
    """A ``tiktoken`` encoding behind the :class:`Tokenizer` protocol.

    Text is encoded with ``encode_ordinary``: special-token strings in a document are ordinary
    text, never control tokens. Source: OpenAI ``tiktoken``.

    Raises:
        TypeError: ``encoding`` is not a ``tiktoken.Encoding`` (always, where tiktoken is not
            installed); the methods' wrong types, as :class:`HFTokenizer`'s.
        ValueError: ``decode`` given an id outside ``[0, vocab_size)``.
    """

    def __init__(self, encoding: object) -> None:
        try:
            import tiktoken
        except ImportError:
            tiktoken = None
        if tiktoken is None or not isinstance(encoding, tiktoken.Encoding):
            raise TypeError(f"encoding must be a tiktoken.Encoding, got {type(encoding).__name__}")
        self.backend = encoding
        self.name = f"tiktoken:{encoding.name}"
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        text = _check_text("TiktokenTokenizer.encode", text)
        return self.backend.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = _check_texts("TiktokenTokenizer.encode_batch", texts)
        return self.backend.encode_ordinary_batch(texts)

    def decode(self, ids: Sequence[int]) -> str:
        ids = _check_ids("TiktokenTokenizer.decode", ids, self.vocab_size)
        return self.backend.decode(ids)

    def __repr__(self) -> str:
        return f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


# Documents per encode_batch call: enough for the tokenizer's thread pool, small enough that
# a loader's first batch arrives quickly.
ENCODE_BATCH_SIZE = 64


def check_document(index: int, document: object) -> None:
    """Refuse what the packing loader cannot take as a document; the loader's one rule.

    A document is a ``str`` (tokenized by the loader's tokenizer) or a ``list``/``tuple`` of
    token ids (a pre-tokenized corpus, handed on as it is). :func:`encode_in_chunks` applies
    this to every document it reads; :func:`~attn_gym_lite.data.sharding.shard_corpus` applies
    it with the index in the whole corpus (the loader over a shard would count within the shard).

    Args:
        index: the document's position in the corpus the user passed, used in the message.
        document: the document to check.

    Raises:
        TypeError: ``document`` is neither a ``str`` nor a ``list``/``tuple`` (the message names
            ``corpus[index]``, the expected form and the value).
    """
    if not isinstance(document, (str, list, tuple)):
        raise TypeError(
            f"corpus[{index}] must be a document string or a list/tuple of token ids, "
            f"got {type(document).__name__}: {document!r:.60}"
        )


def corpus_function(corpus: Callable[[], Iterable[object]]) -> Callable[[], Iterator[object]]:
    """``corpus``, a zero-argument corpus function, wrapped so that each call checks its result.

    The loaders' one rule for a corpus given as a function (:class:`~attn_gym_lite.data.PackedLoader`,
    :func:`~attn_gym_lite.data.sharding.shard_corpus`). Before it, a function returning a string
    gave one document per character, and one returning ``None`` failed at the first batch with a
    bare "'NoneType' object is not iterable".

    Raises:
        TypeError: at the call, ``corpus`` cannot be called with no arguments; at each call of the
            result, ``corpus()`` returned a string or bytes (one document is ``[text]``) or
            something not iterable.
    """
    try:
        inspect.signature(corpus).bind()
    except TypeError:
        raise TypeError(f"corpus must be callable with no arguments (e.g. functools.partial(jsonl_texts, path)), "
                        f"got {corpus!r:.80}, which needs some") from None
    except ValueError:  # no signature to read (some builtins): found out when called
        pass

    def documents() -> Iterator[object]:
        result = corpus()
        if isinstance(result, (str, bytes)):
            raise TypeError(f"corpus() must return an iterable of documents, got a {type(result).__name__} "
                            f"({result!r:.40}), which would be one document per character: return [text]")
        try:
            return iter(result)
        except TypeError:
            raise TypeError(f"corpus() must return an iterable of documents, got {type(result).__name__}") from None

    return documents


def check_token_ids(index: int, ids: Sequence[object], vocab_size: int, tokenizer_name: str = "the tokenizer") -> None:
    """Refuse a pre-tokenized document whose ids the tokenizer (and so the model) cannot have.

    Args:
        index: the document's position in the corpus, used in the message.
        ids: its token ids (a list or tuple).
        vocab_size: the tokenizer's ``vocab_size``; every id must be in ``[0, vocab_size)``.
        tokenizer_name: named in the message.

    Raises:
        TypeError: an id is not an int (``bool`` included); the message names ``corpus[index][i]``.
        ValueError: an id outside ``[0, vocab_size)``; the message names the first,
            ``corpus[index][i]``, and its value.

    Cost: one pass in C (``min``/``max``) plus a type test per id; the position is looked for only
    when a check fails.
    """
    if not ids:
        return
    if not all(type(token) is int for token in ids):
        for position, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise TypeError(f"corpus[{index}][{position}] must be a token id (an int), got "
                                f"{type(token).__name__}: {token!r:.40}")
    if min(ids) < 0 or max(ids) >= vocab_size:
        position = next(p for p, token in enumerate(ids) if not 0 <= token < vocab_size)
        raise ValueError(
            f"corpus[{index}][{position}] must be a token id in [0, {vocab_size}) (the vocabulary of "
            f"{tokenizer_name}), got {int(ids[position])}: pass the tokenizer whose ids these are as "
            f"tokenizer= (its vocab_size bounds the ids)"
        )


def encode_in_chunks(
    documents: Iterable[tuple[int, object]], tokenizer: Tokenizer
) -> Iterator[list[tuple[int, Sequence[int]]]]:
    """Token ids of numbered documents, :data:`ENCODE_BATCH_SIZE` documents at a time.

    The package's one tokenizing loop (the loader and the corpus study use it). The string
    documents of a chunk go through one ``tokenizer.encode_batch`` call (the Rust tokenizers
    spread it over threads); a document given as a list or tuple of token ids (a pre-tokenized
    corpus) is handed back as it is. A chunk is read from ``documents`` only when the consumer
    asks for it, so a lazy corpus is read no further than needed.

    Args:
        documents: ``(index, document)`` pairs; ``index`` is the document's position in its
            corpus, handed back with its ids and used to name it in errors.
        tokenizer: a :class:`Tokenizer`.

    Yields:
        Per chunk of up to ``ENCODE_BATCH_SIZE`` documents, ``[(index, ids), ...]`` in input order.

    Raises:
        TypeError: a document is neither a string nor a list/tuple of token ids, or a
            pre-tokenized document holds a non-int (raised when its chunk is reached; the message
            names ``corpus[index]``).
        ValueError: a pre-tokenized document holds an id outside ``[0, tokenizer.vocab_size)``
            (:func:`check_token_ids`: the message names ``corpus[index][i]`` and the id), which
            would otherwise fail late, in the model's embedding.
        TypeError / ValueError: ``tokenizer.encode_batch`` returned something other than one list
            of ids per text, or (a tokenizer other than :class:`HFTokenizer` and
            :class:`TiktokenTokenizer`) an id that is not an int in ``[0, vocab_size)``; the
            message names the tokenizer, ``corpus[index]``, the position and the id.
    """
    documents = iter(documents)
    vocab_size = None
    while chunk := list(itertools.islice(documents, ENCODE_BATCH_SIZE)):
        for index, document in chunk:
            check_document(index, document)
            if not isinstance(document, str):
                if vocab_size is None:  # asked once, and only if a pre-tokenized document comes
                    vocab_size = tokenizer.vocab_size
                check_token_ids(index, document, vocab_size, repr(tokenizer.name))
        numbered_texts = [(index, document) for index, document in chunk if isinstance(document, str)]
        encoded = iter(_encoded(tokenizer, numbered_texts) if numbered_texts else [])
        yield [(index, next(encoded) if isinstance(document, str) else document) for index, document in chunk]


def _encoded(tokenizer: Tokenizer, numbered_texts: list[tuple[int, str]]) -> list[Sequence[int]]:
    """``tokenizer.encode_batch`` of the texts, checked: one list of ids per text and, for a
    tokenizer other than the package's two wrappers (whose backends return ints in range), every id
    an int in ``[0, vocab_size)`` (a 1-D array or tensor of ids is taken as its list). Unchecked, a
    custom tokenizer's float ids were truncated into the
    batch and its out-of-vocabulary ids reached the embedding (a device-side assert on CUDA)."""
    result = tokenizer.encode_batch([text for _, text in numbered_texts])
    name = f"tokenizer {tokenizer.name!r}"
    if isinstance(result, (str, bytes)) or not isinstance(result, Sequence):
        raise TypeError(f"{name}: encode_batch must return a list of token-id lists, got {type(result).__name__}")
    if len(result) != len(numbered_texts):
        raise ValueError(f"{name}: encode_batch must return one token-id list per text, got {len(result)} "
                         f"for {len(numbered_texts)} texts ("
                         + ", ".join(f"corpus[{index}]" for index, _ in numbered_texts[:4])
                         + (", ..." if len(numbered_texts) > 4 else "") + ")")
    if isinstance(tokenizer, (HFTokenizer, TiktokenTokenizer)):
        return result
    vocab_size = tokenizer.vocab_size
    result = list(result)
    for i, ((index, _), ids) in enumerate(zip(numbered_texts, result)):
        if getattr(ids, "ndim", None) == 1 and hasattr(ids, "tolist"):  # a 1-D array or tensor of ids
            ids = result[i] = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise TypeError(f"{name}: encode_batch gave corpus[{index}] {type(ids).__name__}, not a list of token ids")
        if ids and not (all(type(token) is int for token in ids) and 0 <= min(ids) and max(ids) < vocab_size):
            for position, token in enumerate(ids):
                if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                    raise TypeError(f"{name}: encode_batch gave corpus[{index}] a token id that is not an int at "
                                    f"position {position}: {type(token).__name__} {token!r:.40}")
                if not 0 <= token < vocab_size:
                    raise ValueError(f"{name}: encode_batch gave corpus[{index}] the id {int(token)} at position "
                                     f"{position}, outside its vocabulary [0, {vocab_size})")
    return result

DEFAULT_VOCAB_SIZE = 8192
DEFAULT_MAX_TRAINING_BYTES = 4_000_000
END_OF_TEXT = "<|endoftext|>"


def _cache_dir() -> Path:
    """``$ATTN_GYM_LITE_CACHE`` if set, else ``~/.cache/attn_gym_lite``."""
    configured = os.environ.get("ATTN_GYM_LITE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "attn_gym_lite"


def _train_stdlib_bpe(vocab_size: int, max_training_bytes: int) -> object:
    """Train a byte-level BPE on the first ``max_training_bytes`` bytes of the stdlib corpus."""
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    training_texts, size = [], 0
    # Whole files, in corpus order, until the budget is reached (always at least one file).
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
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
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


def _tiktoken_tokenizer(encoding_name: str) -> TiktokenTokenizer:
    try:
        import tiktoken
    except ImportError:
        raise ValueError(
            f"spec='tiktoken:{encoding_name}' needs tiktoken: pip install 'attn-gym-lite[tiktoken]'"
        ) from None
    known = tiktoken.list_encoding_names()
    if encoding_name not in known:
        raise ValueError(f"spec='tiktoken:{encoding_name}': unknown encoding (known: {known})")
    try:
        encoding = tiktoken.get_encoding(encoding_name)
    except Exception as error:  # tiktoken downloads encodings; offline this fails variously
        raise RuntimeError(
            f"spec='tiktoken:{encoding_name}': could not load the encoding (tiktoken downloads "
            f"it on first use and caches it under $TIKTOKEN_CACHE_DIR; offline?): {error!r}"
        ) from error
    return TiktokenTokenizer(encoding)


def load_tokenizer(
    spec: str | os.PathLike[str] | None = None,
    *,
    vocab_size: int | None = None,
    max_training_bytes: int | None = None,
) -> HFTokenizer | TiktokenTokenizer:
    """Load a tokenizer by spec.

    * ``None``: the default, a byte-level BPE (HF ``tokenizers``, ``vocab_size`` 8192, special
      token ``"<|endoftext|>"``) trained on the first ``max_training_bytes`` (4 MB) of
      :func:`python_stdlib_corpus`, about 1 s on 2 CPU cores. It is cached as
      ``<cache>/stdlib-bpe-py<X.Y>-vocab<V>-<B>B/tokenizer.json``, where ``<cache>`` is
      ``$ATTN_GYM_LITE_CACHE`` or ``~/.cache/attn_gym_lite``; later calls load the file. With
      little training text the vocabulary may come out smaller than ``vocab_size``.
    * a path to a HF ``tokenizer.json``.
    * ``"tiktoken:<encoding>"``, e.g. ``"tiktoken:cl100k_base"``, if tiktoken is installed and
      the encoding is cached locally or downloadable.

    Args:
        spec: see above.
        vocab_size: default tokenizer only: target vocabulary (>= 257: 256 bytes + the special
            token). Defaults to 8192.
        max_training_bytes: default tokenizer only: training text budget in bytes (>= 1).
            Defaults to 4_000_000.

    Returns:
        An object satisfying :class:`Tokenizer`.

    Raises:
        FileNotFoundError: ``spec`` is a path that does not exist, or a directory (the message says which).
        ValueError (also): ``spec`` is a file that is not a ``tokenizer.json``.
        ValueError: unknown tiktoken encoding, tiktoken not installed, or ``vocab_size`` /
            ``max_training_bytes`` given with a non-default ``spec`` or out of range.
        RuntimeError: tiktoken could not load the encoding (e.g. offline, not cached).
        TypeError: ``spec`` is neither None, a str nor a path.

    Source: HF ``tokenizers`` (``BpeTrainer``, ``ByteLevel``); OpenAI ``tiktoken``.
    """
    if spec is None:
        vocab_size = check_int(
            "vocab_size", DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size, minimum=257
        )
        max_training_bytes = check_int(
            "max_training_bytes",
            DEFAULT_MAX_TRAINING_BYTES if max_training_bytes is None else max_training_bytes,
            minimum=1,
        )
        return _default_tokenizer(vocab_size, max_training_bytes)
    if vocab_size is not None or max_training_bytes is not None:
        raise ValueError(
            f"vocab_size and max_training_bytes only apply to the default tokenizer (spec=None), "
            f"got spec={spec!r}"
        )
    if isinstance(spec, str) and spec.startswith("tiktoken:"):
        return _tiktoken_tokenizer(spec.removeprefix("tiktoken:"))
    from tokenizers import Tokenizer as _HFTokenizer

    if isinstance(spec, str) and not os.path.exists(spec) and os.sep not in spec and not spec.endswith(".json"):
        # A bare name such as "gpt2" or "cl100k_base": nothing here downloads a tokenizer by name.
        raise FileNotFoundError(
            f"spec={spec!r}: no such file; a tiktoken encoding is spelled 'tiktoken:<name>' (e.g. "
            f"'tiktoken:{spec}'), a Hugging Face tokenizer is the path of its tokenizer.json, and None is the default BPE")
    path = check_file("spec", spec)
    try:
        loaded = _HFTokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises plain Exceptions ("stream did not contain valid UTF-8", ...)
        raise ValueError(f"spec={str(path)!r} must be a Hugging Face tokenizer.json file: {error}") from None
    return HFTokenizer(loaded, str(path))




def resolve_tokenizer(tokenizer: object) -> Tokenizer:
    """A :class:`Tokenizer` from an object or a :func:`load_tokenizer` spec (None: the default).

    Raises:
        TypeError: ``tokenizer`` is neither a spec nor an object with the protocol's members; its
            ``vocab_size`` is not an int (``bool`` included) or its ``name`` not a ``str``.
        ValueError: its ``vocab_size`` is < 1.
        Whatever :func:`load_tokenizer` raises for a spec.
    """
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer)
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            "tokenizer must have name, vocab_size, encode, encode_batch and decode "
            f"(see attn_gym_lite.data.Tokenizer), got {type(tokenizer).__name__}"
        )
    # The protocol checks only that the members exist; the loader uses these two as values.
    check_int("tokenizer.vocab_size", tokenizer.vocab_size, minimum=1)
    if not isinstance(tokenizer.name, str):
        raise TypeError(f"tokenizer.name must be a str, got {type(tokenizer.name).__name__}: {tokenizer.name!r:.40}")
    return tokenizer
