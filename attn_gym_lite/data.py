"""Packed batches from synthetic and real text.

A CUDA graph replays fixed shapes, so every batch handed to it has the same *capacity*: ``T``
token rows and ``N + 1`` ``cu_seqlens`` slots. What varies from step to step is how much of that
capacity is *active*: ``L = cu_seqlens[-1]`` tokens in ``M`` non-empty sequences. This module
produces such batches on the CPU:

* :class:`PackedBatch`, the fixed-capacity container a training loop copies into its static
  buffers;
* :func:`packed_batch_loader`, a synthetic loader (random ids, Zipf lengths) whose active size
  shrinks over the run, as in the seed article's "A More Realistic Training Loop";
* corpora (:func:`python_stdlib_corpus`, :func:`text_files`, :func:`jsonl_texts`,
  :func:`parquet_texts`), tokenizers (:func:`load_tokenizer`) and :func:`real_text_loader`, which
  packs real tokenized documents greedily and in order.

Everything here runs on the CPU and is deterministic.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import numbers
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths

__all__ = [
    "PackedBatch",
    "packed_batch_loader",
    "python_stdlib_corpus",
    "text_files",
    "jsonl_texts",
    "parquet_texts",
    "Tokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "load_tokenizer",
    "real_text_loader",
]


def _check_int(argument: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``argument``, the expectation and the value."""
    # bool is an Integral, but ``token_capacity=True`` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{argument} must be an int >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{argument} must be an int <= {maximum}, got {value}")
    return value


def _check_capacities(token_capacity: object, sequence_capacity: object) -> tuple[int, int]:
    """Validate ``T >= 1`` and ``1 <= N <= T`` (a sequence holds at least one token)."""
    token_capacity = _check_int("token_capacity", token_capacity, minimum=1)
    sequence_capacity = _check_int(
        "sequence_capacity", sequence_capacity, minimum=1, maximum=token_capacity
    )
    return token_capacity, sequence_capacity


# ---------------------------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """One fixed-capacity packed batch on the CPU: ``T`` token rows, ``N`` sequence slots.

    The first ``L`` rows hold ``M`` sequences back to back; rows ``L..T-1`` are padding
    (input id 0, label 0, loss mask False). Only the active sizes change between batches, so a
    CUDA graph captured on one batch's shapes can replay every batch after a ``copy_`` into its
    static buffers.

    Attributes:
        input_ids: int64 ``[T]`` token ids.
        labels: int64 ``[T]`` next-token targets within the same sequence:
            ``labels[t] == input_ids[t + 1]`` wherever ``loss_mask[t]`` is True. Where there is
            no target (a sequence's last token, padding) the label is 0.
        loss_mask: bool ``[T]``, True where ``labels`` is a real target that the loss counts.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L, L]``; the unused tail repeats
            ``L`` so that trailing slots describe empty sequences.
        active_tokens: ``L = cu_seqlens[-1]`` (tokens), ``0 <= L <= T``.
        active_sequences: ``M``, the number of non-empty sequences, ``0 <= M <= N``.
        max_seqlen: ``S_max``, the longest active sequence (tokens).

    Raises:
        TypeError: a field has the wrong type or dtype.
        ValueError: a field has the wrong shape or an out-of-range size.

    Source: seed article, "A More Realistic Training Loop" (``PackedBatch``).
    """

    input_ids: Tensor
    labels: Tensor
    loss_mask: Tensor
    cu_seqlens: Tensor
    active_tokens: int
    active_sequences: int
    max_seqlen: int

    def __post_init__(self) -> None:
        # Shapes and dtypes only: reading tensor values here would sync if a caller built a
        # batch from device tensors.
        expected = {
            "input_ids": torch.int64,
            "labels": torch.int64,
            "loss_mask": torch.bool,
            "cu_seqlens": torch.int32,
        }
        for name, dtype in expected.items():
            tensor = getattr(self, name)
            if not isinstance(tensor, Tensor):
                raise TypeError(f"PackedBatch.{name} must be a torch.Tensor, got {type(tensor)}")
            if tensor.dtype != dtype or tensor.dim() != 1:
                raise TypeError(
                    f"PackedBatch.{name} must be a 1-D {dtype} tensor, "
                    f"got {tensor.dtype} of shape {tuple(tensor.shape)}"
                )
        token_capacity = self.input_ids.shape[0]
        for name in ("labels", "loss_mask"):
            if getattr(self, name).shape[0] != token_capacity:
                raise ValueError(
                    f"PackedBatch.{name} must have T={token_capacity} rows like input_ids, "
                    f"got {getattr(self, name).shape[0]}"
                )
        if self.cu_seqlens.shape[0] < 2:
            raise ValueError(
                "PackedBatch.cu_seqlens must have N + 1 >= 2 entries, "
                f"got {self.cu_seqlens.shape[0]}"
            )
        _check_int(
            "PackedBatch.active_tokens", self.active_tokens, minimum=0, maximum=token_capacity
        )
        _check_int(
            "PackedBatch.active_sequences",
            self.active_sequences,
            minimum=0,
            maximum=self.sequence_capacity,
        )
        _check_int("PackedBatch.max_seqlen", self.max_seqlen, minimum=0, maximum=self.active_tokens)

    @property
    def token_capacity(self) -> int:
        """``T``: rows of ``input_ids``/``labels``/``loss_mask``."""
        return self.input_ids.shape[0]

    @property
    def sequence_capacity(self) -> int:
        """``N``: sequence slots, ``cu_seqlens`` has ``N + 1`` entries."""
        return self.cu_seqlens.shape[0] - 1

    def pin_memory(self) -> PackedBatch:
        """Return a copy whose tensors live in pinned (page-locked) host memory.

        Pinned memory lets ``static.copy_(batch.x, non_blocking=True)`` run asynchronously.
        Pinning needs a CUDA driver (some CPU-only torch builds raise), so without CUDA this
        returns ``self`` unchanged: the same training code then runs in CPU mode.
        """
        if not torch.cuda.is_available():
            return self
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.pin_memory(),
            labels=self.labels.pin_memory(),
            loss_mask=self.loss_mask.pin_memory(),
            cu_seqlens=self.cu_seqlens.pin_memory(),
        )


def _assemble_batch(
    active_ids: Tensor,
    lengths: Sequence[int],
    token_capacity: int,
    sequence_capacity: int,
    *,
    loss_on_second_half: bool = False,
) -> PackedBatch:
    """Lay ``M`` sequences (``lengths``, each >= 1, summing to ``L``) into a capacity-T batch.

    ``active_ids`` is int64 ``[L]``, the sequences back to back. With ``loss_on_second_half`` only
    tokens in the second half of each sequence count (a prompt/response split).
    """
    active_tokens = active_ids.shape[0]
    lengths_tensor = torch.tensor(lengths, dtype=torch.int32)
    active_cu_seqlens = cu_seqlens_from_lengths(lengths_tensor)

    input_ids = torch.zeros(token_capacity, dtype=torch.int64)
    labels = torch.zeros(token_capacity, dtype=torch.int64)
    loss_mask = torch.zeros(token_capacity, dtype=torch.bool)
    input_ids[:active_tokens] = active_ids
    # Shift by one over the whole active region, then cut at sequence ends: the target of a
    # sequence's last token would be the next sequence's first token, which it must not predict.
    labels[: active_tokens - 1] = active_ids[1:]
    loss_mask[: active_tokens - 1] = True
    last_tokens = active_cu_seqlens[1:].long() - 1
    labels[last_tokens] = 0
    loss_mask[last_tokens] = False
    if loss_on_second_half:
        starts = active_cu_seqlens[:-1].long()
        response_starts = starts + lengths_tensor.long() // 2
        positions = torch.arange(active_tokens)
        per_token_start = torch.repeat_interleave(response_starts, lengths_tensor.long())
        loss_mask[:active_tokens] &= positions >= per_token_start
        labels[:active_tokens] *= loss_mask[:active_tokens]

    return PackedBatch(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        cu_seqlens=pad_cu_seqlens(active_cu_seqlens, sequence_capacity),
        active_tokens=active_tokens,
        active_sequences=len(lengths),
        max_seqlen=max(lengths),
    )


# ---------------------------------------------------------------------------------------------
# Synthetic loader
# ---------------------------------------------------------------------------------------------


def packed_batch_loader(
    num_batches: int,
    token_capacity: int,
    vocab_size: int,
    sequence_capacity: int,
    *,
    seed: int = 0,
) -> Iterator[PackedBatch]:
    """Yield ``num_batches`` synthetic packed batches whose active size shrinks over the run.

    Batch ``i`` has ``L_i`` active tokens, falling linearly (rounded) from ``T`` for the first
    batch to ``max(N, T // 8)`` for the last, in ``M_i = max(1, round(N * L_i / T))`` sequences
    with Zipf-distributed lengths (:func:`attn_gym_lite.ragged.zipf_lengths`, exponent 1.2).
    The first batch is at full capacity (``L = T``, ``M = N``), so a graph captured on it sees
    the largest active shapes. Token ids are uniform in ``[0, vocab_size)``; labels are the
    next token within each sequence, and the loss counts only the second half of each sequence
    (as if the first half were a prompt).

    Args:
        num_batches: batches to yield, >= 1.
        token_capacity: ``T`` (tokens), >= 1.
        vocab_size: ids are drawn from ``[0, vocab_size)``, >= 1.
        sequence_capacity: ``N``, ``1 <= N <= T``.
        seed: seed of the CPU ``torch.Generator`` (>= 0); the same seed gives the same batches.

    Yields:
        :class:`PackedBatch` on the CPU (not pinned; call :meth:`PackedBatch.pin_memory`).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range (checked when called, not at the first batch).

    Source: seed article, "A More Realistic Training Loop" (``packed_batch_loader``).
    """
    num_batches = _check_int("num_batches", num_batches, minimum=1)
    token_capacity, sequence_capacity = _check_capacities(token_capacity, sequence_capacity)
    vocab_size = _check_int("vocab_size", vocab_size, minimum=1)
    seed = _check_int("seed", seed, minimum=0)

    smallest = max(sequence_capacity, token_capacity // 8)
    steps = max(num_batches - 1, 1)
    active_token_counts = [
        round(token_capacity - (token_capacity - smallest) * i / steps) for i in range(num_batches)
    ]

    def batches() -> Iterator[PackedBatch]:
        generator = torch.Generator().manual_seed(seed)
        for active_tokens in active_token_counts:
            # L >= N and L <= T imply 1 <= M <= N <= L, so every sequence gets a token.
            active_sequences = max(1, round(sequence_capacity * active_tokens / token_capacity))
            lengths = zipf_lengths(active_tokens, active_sequences, generator=generator)
            active_ids = torch.randint(vocab_size, (active_tokens,), generator=generator)
            yield _assemble_batch(
                active_ids,
                lengths.tolist(),
                token_capacity,
                sequence_capacity,
                loss_on_second_half=True,
            )

    return batches()


# ---------------------------------------------------------------------------------------------
# Corpora: iterators of document strings in a fixed order
# ---------------------------------------------------------------------------------------------

# Directory names left out of the stdlib corpus: third-party packages and the stdlib's own test
# suites (test/, tests/, idlelib/idle_test, lib2to3/tests, ctypes/test, ...), which are large,
# repetitive and absent from many distributions' Python builds.
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def _stdlib_source_files() -> list[Path]:
    """The stdlib's ``.py`` files in sorted order of their path relative to the stdlib root."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library folder {str(root)!r} does not exist")
    relative_paths = []
    for folder, subfolders, files in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages (often much larger than the stdlib).
        subfolders[:] = [name for name in subfolders if name not in _STDLIB_SKIPPED_DIRS]
        relative_folder = Path(folder).relative_to(root)
        relative_paths += [relative_folder / name for name in files if name.endswith(".py")]
    return [root / path for path in sorted(relative_paths, key=Path.as_posix)]


def python_stdlib_corpus(limit: int | None = None) -> Iterator[str]:
    """Yield the source code of the running Python's standard library, one file per document.

    Files are the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` in sorted order of
    their relative path, skipping ``site-packages``/``dist-packages``, test folders (any folder
    named ``test``, ``tests`` or ``idle_test``), files that are not valid UTF-8 and empty
    (whitespace-only) files. It is real code, available offline on every machine; the exact
    documents depend on the Python version (CPython 3.11: 731 files, about 12 MB).

    Args:
        limit: yield at most this many documents (>= 0); None for all.

    Yields:
        Each file's text (str), exactly as stored.

    Raises:
        TypeError, ValueError: ``limit`` is not None or an int >= 0.
        FileNotFoundError: the stdlib folder does not exist (an unusual embedded Python).
    """
    if limit is not None:
        limit = _check_int("limit", limit, minimum=0)
    paths = _stdlib_source_files()

    def documents() -> Iterator[str]:
        for path in paths:
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                yield text

    return itertools.islice(documents(), limit)


def _check_path(argument: str, path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def _check_file(argument: str, path: object) -> Path:
    path = _check_path(argument, path)
    if not path.is_file():
        raise FileNotFoundError(f"{argument}={str(path)!r}: no such file")
    return path


def text_files(folder: str | os.PathLike[str], pattern: str = "**/*.txt") -> Iterator[str]:
    """Yield the text of each file under ``folder`` matching ``pattern``, one file per document.

    Files are read as UTF-8 in sorted order of their path relative to ``folder``.

    Args:
        folder: the folder to search.
        pattern: a relative :meth:`pathlib.Path.glob` pattern; the default ``**/*.txt`` also
            matches files directly in ``folder``.

    Yields:
        Each file's text (str).

    Raises:
        FileNotFoundError: ``folder`` is not an existing folder, or no file matches ``pattern``.
        ValueError: ``pattern`` is empty or absolute; a file is not valid UTF-8 (when reached).
        TypeError: ``folder`` is not a path or ``pattern`` not a str.
    """
    root = _check_path("folder", folder)
    if not root.is_dir():
        raise FileNotFoundError(f"folder={str(root)!r}: no such folder")
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    if not pattern or Path(pattern).is_absolute():
        raise ValueError(f"pattern must be a non-empty relative glob pattern, got {pattern!r}")
    paths = sorted(
        (path for path in root.glob(pattern) if path.is_file()),
        key=lambda path: path.relative_to(root).as_posix(),
    )
    if not paths:
        raise FileNotFoundError(f"no file under folder={str(root)!r} matches pattern={pattern!r}")

    def documents() -> Iterator[str]:
        for path in paths:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{str(path)!r} is not valid UTF-8: {error}") from None

    return documents()


def _jsonl_records(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(line_number, parsed_value)`` for each non-blank line of a JSON Lines file."""
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{str(path)!r} line {line_number} is not JSON: {error}") from None


def _jsonl_text(path: Path, line_number: int, record: object, field: str) -> str | None:
    if not isinstance(record, dict) or field not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"field={field!r} is missing from line {line_number} of {str(path)!r} (found {found})"
        )
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise TypeError(
            f"field={field!r} on line {line_number} of {str(path)!r} must be a string, "
            f"got {type(text).__name__}"
        )
    return text


def jsonl_texts(path: str | os.PathLike[str], field: str = "text") -> Iterator[str]:
    """Yield ``record[field]`` for each record of a JSON Lines file, in file order.

    Blank lines and records whose field is ``null`` are skipped. The first record is checked
    when this is called, so a wrong ``field`` fails at once.

    Args:
        path: a ``.jsonl`` file (UTF-8, one JSON object per line).
        field: the key holding the document text.

    Yields:
        Each document (str).

    Raises:
        FileNotFoundError: ``path`` is not an existing file.
        ValueError: a record lacks ``field`` or a line is not JSON (later lines: when reached).
        TypeError: a record's ``field`` is neither a string nor null.
    """
    path = _check_file("path", path)
    if not isinstance(field, str):
        raise TypeError(f"field must be a str, got {type(field).__name__}")
    for line_number, record in itertools.islice(_jsonl_records(path), 1):
        _jsonl_text(path, line_number, record, field)

    def documents() -> Iterator[str]:
        for line_number, record in _jsonl_records(path):
            text = _jsonl_text(path, line_number, record, field)
            if text is not None:
                yield text

    return documents()


def parquet_texts(
    path: str | os.PathLike[str], column: str = "text", *, batch_size: int = 1024
) -> Iterator[str]:
    """Yield the values of a string column of a Parquet file, in file order.

    The file is streamed ``batch_size`` rows at a time (pyarrow ``ParquetFile.iter_batches``,
    reading only ``column``), so files larger than memory work. Null values are skipped.

    Args:
        path: a Parquet file.
        column: the string column holding the document text.
        batch_size: rows per read (>= 1).

    Yields:
        Each document (str).

    Raises:
        FileNotFoundError: ``path`` is not an existing file.
        ValueError: the file has no column ``column`` (the message lists the columns).
        TypeError: ``column`` is not a string column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _check_file("path", path)
    batch_size = _check_int("batch_size", batch_size, minimum=1)
    with pq.ParquetFile(path) as parquet_file:
        schema = parquet_file.schema_arrow
    if column not in schema.names:
        raise ValueError(f"column={column!r} is not in {str(path)!r} (columns: {schema.names})")
    column_type = schema.field(column).type
    string_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    if not (
        pa.types.is_string(column_type)
        or pa.types.is_large_string(column_type)
        or string_view(column_type)
    ):
        raise TypeError(f"column={column!r} of {str(path)!r} must hold strings, got {column_type}")

    def documents() -> Iterator[str]:
        with pq.ParquetFile(path) as parquet_file:
            for record_batch in parquet_file.iter_batches(batch_size=batch_size, columns=[column]):
                for text in record_batch.column(0).to_pylist():
                    if text is not None:
                        yield text

    return documents()


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


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


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` behind the :class:`Tokenizer` protocol.

    ``encode`` adds no special tokens (no BOS/EOS/CLS): packing marks document boundaries with
    ``cu_seqlens`` instead. Source: HF ``tokenizers`` (``Tokenizer.encode``/``encode_batch``).
    """

    def __init__(self, tokenizer: object, name: str) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        if not isinstance(tokenizer, _HFTokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer)}")
        self.backend = tokenizer
        self.name = name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        # Keep special tokens: a document may contain "<|endoftext|>" as literal text.
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


class TiktokenTokenizer:
    """A ``tiktoken`` encoding behind the :class:`Tokenizer` protocol.

    Text is encoded with ``encode_ordinary``: special-token strings in a document are ordinary
    text, never control tokens. Source: OpenAI ``tiktoken``.
    """

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
        FileNotFoundError: ``spec`` is a path that does not exist.
        ValueError: unknown tiktoken encoding, tiktoken not installed, or ``vocab_size`` /
            ``max_training_bytes`` given with a non-default ``spec`` or out of range.
        RuntimeError: tiktoken could not load the encoding (e.g. offline, not cached).
        TypeError: ``spec`` is neither None, a str nor a path.

    Source: HF ``tokenizers`` (``BpeTrainer``, ``ByteLevel``); OpenAI ``tiktoken``.
    """
    if spec is None:
        vocab_size = _check_int(
            "vocab_size", DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size, minimum=257
        )
        max_training_bytes = _check_int(
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

    path = _check_file("spec", spec)
    return HFTokenizer(_HFTokenizer.from_file(str(path)), str(path))


# ---------------------------------------------------------------------------------------------
# Real-text loader
# ---------------------------------------------------------------------------------------------

# Documents per encode_batch call: enough for the tokenizer's thread pool, small enough that
# the first batch arrives quickly.
_ENCODE_CHUNK = 64


def _tokenized_pieces(
    documents: Iterable[str],
    tokenizer: Tokenizer,
    max_document_tokens: int,
    min_document_tokens: int,
) -> Iterator[list[int]]:
    """Tokenize documents in chunks; yield each kept document as pieces of <= max tokens."""
    documents = iter(documents)
    while chunk := list(itertools.islice(documents, _ENCODE_CHUNK)):
        for ids in tokenizer.encode_batch(chunk):
            if len(ids) < min_document_tokens:
                continue
            for start in range(0, len(ids), max_document_tokens):
                yield list(ids[start : start + max_document_tokens])


def real_text_loader(
    token_capacity: int,
    sequence_capacity: int,
    *,
    corpus: Iterable[str] | None = None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    max_document_tokens: int | None = None,
    num_batches: int | None = None,
    min_document_tokens: int = 2,
) -> Iterator[PackedBatch]:
    """Tokenize documents and pack them, greedily and in order, into fixed-capacity batches.

    Each document (after tokenization) becomes one sequence; one longer than
    ``max_document_tokens`` becomes consecutive pieces of at most that many tokens (no token
    lost or repeated), each piece its own sequence. Pieces are appended to the current batch
    while they fit: a piece that does not fit the remaining ``T - L`` rows, or that would be the
    ``N + 1``-th sequence, closes the batch and opens the next one (no reordering, so the
    corpus order is kept and the output is deterministic). ``cu_seqlens`` boundaries are exactly
    the piece boundaries; labels are next tokens within a piece, and the loss mask is False on
    each piece's last token and on padding.

    Args:
        token_capacity: ``T`` (tokens), >= 1.
        sequence_capacity: ``N``, ``1 <= N <= T``.
        corpus: document strings; default :func:`python_stdlib_corpus`.
        tokenizer: a :class:`Tokenizer`, or a spec for :func:`load_tokenizer`; default the
            stdlib byte-level BPE.
        max_document_tokens: longest piece (tokens), ``1..T``; default ``T``.
        num_batches: stop after this many batches (>= 1); default: until the corpus ends (the
            last, partial batch is yielded too).
        min_document_tokens: drop documents with fewer tokens (>= 1); the default 2 drops
            documents too short to give one next-token target.

    Yields:
        :class:`PackedBatch` on the CPU, each with ``L <= T``, ``1 <= M <= N``.

    Raises:
        TypeError: an argument has the wrong type (e.g. ``corpus`` is a single str).
        ValueError: a size is out of range (checked when called, not at the first batch).

    Source: seed article, "A More Realistic Training Loop" (packed batches of capacity T, N),
    here fed with real text.
    """
    token_capacity, sequence_capacity = _check_capacities(token_capacity, sequence_capacity)
    max_document_tokens = _check_int(
        "max_document_tokens",
        token_capacity if max_document_tokens is None else max_document_tokens,
        minimum=1,
        maximum=token_capacity,
    )
    if num_batches is not None:
        num_batches = _check_int("num_batches", num_batches, minimum=1)
    min_document_tokens = _check_int("min_document_tokens", min_document_tokens, minimum=1)
    if corpus is None:
        corpus = python_stdlib_corpus()
    elif isinstance(corpus, (str, bytes)) or not isinstance(corpus, Iterable):
        raise TypeError(
            f"corpus must be an iterable of document strings, got {type(corpus).__name__}"
        )
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    elif not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            "tokenizer must have name, vocab_size, encode, encode_batch and decode "
            f"(see attn_gym_lite.data.Tokenizer), got {type(tokenizer).__name__}"
        )

    def batches() -> Iterator[PackedBatch]:
        pieces: list[list[int]] = []
        used = 0

        def close() -> PackedBatch:
            active_ids = torch.tensor(
                list(itertools.chain.from_iterable(pieces)), dtype=torch.int64
            )
            lengths = [len(piece) for piece in pieces]
            return _assemble_batch(active_ids, lengths, token_capacity, sequence_capacity)

        for piece in _tokenized_pieces(corpus, tokenizer, max_document_tokens, min_document_tokens):
            if used + len(piece) > token_capacity or len(pieces) == sequence_capacity:
                yield close()
                pieces, used = [], 0
            pieces.append(piece)
            used += len(piece)
        if pieces:
            yield close()

    return itertools.islice(batches(), num_batches)
